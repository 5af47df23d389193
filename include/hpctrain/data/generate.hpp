// Synthetic datasets for tests, examples and benchmarks: Gaussian blobs, interleaved spirals, smooth nonlinear
// regression, images of shapes and textures (classification) and 3-D fields with recoverable parameters (regression).
//
// Every value is a pure function of (parameters, problem seed, seed, sample index), drawn from the counter-based
// generator of core/rng.hpp, so a dataset is reproducible bit for bit, any block of rows can be generated on its own,
// and files of any size are written in bounded memory.
//
// File layout: /features (N, F) float32, or (N, C, S, S) for images and (N, C, S, S, S) for volumes; /labels (N) int32
// in [0, C) for blobs, spirals and images, or /targets (N, K) float32 for regression and volumes; root attributes kind,
// seed, problem_seed, samples, features, classes or outputs, noise, created_by (and size, channels for images and
// volumes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hpctrain {

enum class SyntheticKind {
  blobs,       // C Gaussian clusters; centres uniform in [-10, 10]^F; noise = standard deviation around a centre
  spirals,     // C interleaved spiral arms in a plane of radius 1; noise = standard deviation added to every feature;
               // with F > 2 the plane is a random 2-D subspace of R^F, so every feature carries signal
  regression,  // x ~ N(0, I_F); y_k = sum_m a_km sin(w_km . x + phase_km) + noise * N(0, 1), K outputs
  images,      // (C, S, S) images holding one shape or texture per sample (the class: cross, ring, square, stripes,
               // ...) at a random place, size and brightness, plus Gaussian pixel noise of standard deviation noise
  volumes,     // (C, S, S, S) fields: per channel a sum of 3 plane waves in random directions whose amplitude,
               // frequency and spectral slope are set by the sample's 3 targets in [-1, 1], plus Gaussian noise
};

struct SyntheticSpec {
  SyntheticKind kind = SyntheticKind::blobs;
  std::int64_t samples = 0;
  std::int64_t features = 2;
  std::int64_t classes = 3;   // blobs, spirals
  std::int64_t outputs = 1;   // regression (volumes: always 3)
  std::int64_t size = 16;     // images, volumes: edge length S
  std::int64_t channels = 1;  // images, volumes
  double noise = 1.0;
  std::uint64_t seed = 0;          // the samples: labels, positions, noise
  std::uint64_t problem_seed = 0;  // the problem: blob centres, regression weights, the spirals' plane (F > 2)
};

// Throws InputError naming the valid kinds.
SyntheticKind parse_synthetic_kind(const std::string& name);
const char* synthetic_kind_name(SyntheticKind kind);
std::vector<std::string> synthetic_kind_names();
bool is_classification(SyntheticKind kind);
bool is_spatial(SyntheticKind kind);  // images and volumes: (C, S, S) and (C, S, S, S) samples

// The defaults of one kind: blobs F=2 C=3 noise 1; spirals F=2 C=3 noise 0.05; regression F=4 K=1 noise 0.1;
// images 1x16x16 C=4 noise 0.2; volumes 1x16x16x16 K=3 noise 0.05.
SyntheticSpec default_synthetic_spec(SyntheticKind kind);

// One sample's feature shape: (F), (C, S, S) for images, (C, S, S, S) for volumes.
std::vector<std::int64_t> synthetic_sample_shape(const SyntheticSpec& spec);
// Sets size and channels of an image or volume spec and the matching features (= C * S^2 or C * S^3).
void set_spatial_extent(SyntheticSpec& spec, std::int64_t size, std::int64_t channels);
// The largest number of classes images has.
inline constexpr std::int64_t image_classes_max = 8;

// Throws InputError when a parameter is out of range (samples >= 1, classes >= 2, spirals need features >= 2, ...).
void validate_synthetic_spec(const SyntheticSpec& spec);

// Rows [first, first + count) of the dataset described by spec. features: (count, F). For classification labels is
// (count) and targets is unused; for regression targets is (count, K) and labels is unused (either may be null then).
void generate_rows(const SyntheticSpec& spec, std::int64_t first, std::int64_t count, float* features,
                   std::int32_t* labels, float* targets);

// Writes the whole dataset to path (created or truncated), block by block; the caller picks the name (see data generate
// for the write-then-rename that keeps half files away from the real name).
void write_synthetic_dataset(const SyntheticSpec& spec, const std::string& path);

}  // namespace hpctrain
