// Synthetic datasets as pure functions of (parameters, seed, sample index), written to HDF5 block by block.
#include "hpctrain/data/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/rng.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

namespace {

// Sub-streams of RngPurpose::data_generation, so that e.g. the labels never share random numbers with the noise. The
// stream id is (role << 24 | block): a block supplies four 32-bit words, so one index gets up to 2^26 words per role.
// The problem's roles (centres, frame, weights, amplitudes) draw from the problem seed, the others from the sample
// seed: files written with different --seed and the same --problem-seed are samples of one problem.
enum class Role : std::uint32_t {
  label = 1,         // per sample: class, and spiral position along the arm
  position = 2,      // per sample: regression inputs
  sample_noise = 3,  // per sample: noise added to the features
  centres = 4,       // per class: blob centres
  frame = 5,         // per axis of the plane spirals live in (F > 2)
  weights = 6,       // per (output, term): regression frequencies w_km
  amplitudes = 7,    // per (output, term): regression amplitude a_km and phase
  target_noise = 8,  // per sample: noise added to regression targets
  shape = 9,         // per sample: an image's shape position, size and brightness
  parameters = 10,   // per sample: a volume's three parameters (its targets)
  waves = 11,        // per (sample, channel): a volume's wave directions and phases
};

constexpr std::int64_t max_features = std::int64_t{1} << 24;  // keeps block numbers inside 24 bits (4 words each)
constexpr std::int64_t max_classes = std::int64_t{1} << 24;
constexpr std::int64_t max_outputs = std::int64_t{1} << 16;
constexpr int regression_terms = 4;           // sine terms per output
constexpr double regression_frequency = 1.5;  // w . x has standard deviation 1.5 rad: clearly nonlinear, still smooth
constexpr double spiral_turns = 1.0;
constexpr double spiral_inner_radius = 0.1;  // arms start apart from each other, not all at the origin
constexpr double blob_box = 10.0;

Philox4 draw(std::uint64_t seed, Role role, std::uint32_t block, std::uint64_t index) {
  return random_bits(seed, RngPurpose::data_generation, (static_cast<std::uint32_t>(role) << 24) | block, index);
}

// Uniform in (0, 1) from all 32 bits: never 0, so log() in Box-Muller stays finite.
double open_uniform(std::uint32_t bits) { return (static_cast<double>(bits) + 0.5) * (1.0 / 4294967296.0); }

// Standard normals for one (role, index), produced four at a time by Box-Muller on one Philox block.
class NormalSequence {
 public:
  NormalSequence(std::uint64_t seed, Role role, std::uint64_t index) : seed_(seed), role_(role), index_(index) {}
  double next() {
    if (used_ == 4) refill();
    return values_[used_++];
  }

 private:
  void refill() {
    const Philox4 bits = draw(seed_, role_, block_++, index_);
    for (int pair = 0; pair < 2; ++pair) {
      const double radius = std::sqrt(-2.0 * std::log(open_uniform(bits.v[2 * pair])));
      const double angle = 2.0 * std::numbers::pi * open_uniform(bits.v[2 * pair + 1]);
      values_[2 * pair] = radius * std::cos(angle);
      values_[2 * pair + 1] = radius * std::sin(angle);
    }
    used_ = 0;
  }
  std::uint64_t seed_;
  Role role_;
  std::uint64_t index_;
  std::uint32_t block_ = 0;
  double values_[4] = {};
  int used_ = 4;
};

// An unbiased-enough class in [0, classes) from 32 random bits (multiply-shift: no modulo bias beyond 2^-32 * C).
std::int32_t class_from_bits(std::uint32_t bits, std::int64_t classes) {
  return static_cast<std::int32_t>((static_cast<std::uint64_t>(bits) * static_cast<std::uint64_t>(classes)) >> 32);
}

std::int32_t label_of(const SyntheticSpec& spec, std::int64_t sample) {
  return class_from_bits(draw(spec.seed, Role::label, 0, static_cast<std::uint64_t>(sample)).v[0], spec.classes);
}

// --- blobs ---

std::vector<double> blob_centres(const SyntheticSpec& spec) {  // (C, F)
  std::vector<double> centres(static_cast<std::size_t>(spec.classes * spec.features));
  for (std::int64_t c = 0; c < spec.classes; ++c) {
    for (std::int64_t j = 0; j < spec.features; ++j) {
      const Philox4 bits =
          draw(spec.problem_seed, Role::centres, static_cast<std::uint32_t>(j / 4), static_cast<std::uint64_t>(c));
      centres[static_cast<std::size_t>(c * spec.features + j)] = blob_box * (2.0 * open_uniform(bits.v[j % 4]) - 1.0);
    }
  }
  return centres;
}

void generate_blobs(const SyntheticSpec& spec, std::int64_t first, std::int64_t count, float* features,
                    std::int32_t* labels) {
  const std::vector<double> centres = blob_centres(spec);  // (C, F)
  const std::int64_t width = spec.features;
#pragma omp parallel for schedule(static) if (count * width > 65536)
  for (std::int64_t row = 0; row < count; ++row) {
    const std::int64_t sample = first + row;
    const std::int32_t label = label_of(spec, sample);
    NormalSequence noise(spec.seed, Role::sample_noise, static_cast<std::uint64_t>(sample));
    const double* centre = centres.data() + label * width;
    for (std::int64_t j = 0; j < width; ++j)
      features[row * width + j] = static_cast<float>(centre[j] + spec.noise * noise.next());
    labels[row] = label;
  }
}

// --- spirals ---

// Two orthonormal vectors of R^F spanning the plane the spirals live in: the first two axes for F = 2 (so a 2-D file
// plots as the familiar picture), a random plane (Gram-Schmidt on Gaussian vectors) otherwise.
std::vector<double> spiral_frame(const SyntheticSpec& spec) {  // (2, F)
  const std::int64_t width = spec.features;
  std::vector<double> frame(static_cast<std::size_t>(2 * width), 0.0);
  if (width == 2) {
    frame[0] = 1.0;
    frame[3] = 1.0;
    return frame;
  }
  for (int axis = 0; axis < 2; ++axis) {
    double* vector = frame.data() + axis * width;
    NormalSequence normals(spec.problem_seed, Role::frame, static_cast<std::uint64_t>(axis));
    for (std::int64_t j = 0; j < width; ++j) vector[j] = normals.next();
    if (axis == 1) {  // remove the component along the first axis
      double along = 0;
      for (std::int64_t j = 0; j < width; ++j) along += vector[j] * frame[static_cast<std::size_t>(j)];
      for (std::int64_t j = 0; j < width; ++j) vector[j] -= along * frame[static_cast<std::size_t>(j)];
    }
    double norm = 0;
    for (std::int64_t j = 0; j < width; ++j) norm += vector[j] * vector[j];
    norm = std::sqrt(norm);
    for (std::int64_t j = 0; j < width; ++j) vector[j] /= norm;
  }
  return frame;
}

void generate_spirals(const SyntheticSpec& spec, std::int64_t first, std::int64_t count, float* features,
                      std::int32_t* labels) {
  const std::vector<double> frame = spiral_frame(spec);  // (2, F)
  const std::int64_t width = spec.features;
#pragma omp parallel for schedule(static) if (count * width > 65536)
  for (std::int64_t row = 0; row < count; ++row) {
    const std::int64_t sample = first + row;
    const Philox4 bits = draw(spec.seed, Role::label, 0, static_cast<std::uint64_t>(sample));
    const std::int32_t label = class_from_bits(bits.v[0], spec.classes);
    // Arm `label` is the first arm rotated by label/C of a turn; t runs along the arm from the inside out. Adjacent
    // arms are (1 - inner radius) / (turns * C) apart radially, which the default noise leaves clearly separable.
    const double t = open_uniform(bits.v[1]);
    const double radius = spiral_inner_radius + (1.0 - spiral_inner_radius) * t;
    const double angle =
        2.0 * std::numbers::pi * (spiral_turns * t + static_cast<double>(label) / static_cast<double>(spec.classes));
    const double in_plane[2] = {radius * std::cos(angle), radius * std::sin(angle)};
    NormalSequence noise(spec.seed, Role::sample_noise, static_cast<std::uint64_t>(sample));
    for (std::int64_t j = 0; j < width; ++j) {
      const double value = in_plane[0] * frame[static_cast<std::size_t>(j)] +
                           in_plane[1] * frame[static_cast<std::size_t>(width + j)] + spec.noise * noise.next();
      features[row * width + j] = static_cast<float>(value);
    }
    labels[row] = label;
  }
}

// --- regression ---

struct RegressionModel {
  std::vector<double> weights;     // (K, M, F): w_km, scaled so that w_km . x ~ N(0, frequency^2)
  std::vector<double> amplitudes;  // (K, M)
  std::vector<double> phases;      // (K, M)
};

RegressionModel regression_model(const SyntheticSpec& spec) {
  const std::int64_t terms = spec.outputs * regression_terms, width = spec.features;
  RegressionModel model;
  model.weights.resize(static_cast<std::size_t>(terms * width));
  model.amplitudes.resize(static_cast<std::size_t>(terms));
  model.phases.resize(static_cast<std::size_t>(terms));
  const double scale = regression_frequency / std::sqrt(static_cast<double>(width));
  for (std::int64_t term = 0; term < terms; ++term) {
    NormalSequence normals(spec.problem_seed, Role::weights, static_cast<std::uint64_t>(term));
    for (std::int64_t j = 0; j < width; ++j)
      model.weights[static_cast<std::size_t>(term * width + j)] = scale * normals.next();
    NormalSequence amplitude(spec.problem_seed, Role::amplitudes, static_cast<std::uint64_t>(term));
    // Amplitudes ~ N(0, 1/M): each output has variance about 1/2 before noise, whatever M is.
    model.amplitudes[static_cast<std::size_t>(term)] = amplitude.next() / std::sqrt(double{regression_terms});
    const Philox4 bits = draw(spec.problem_seed, Role::amplitudes, 1, static_cast<std::uint64_t>(term));
    model.phases[static_cast<std::size_t>(term)] = 2.0 * std::numbers::pi * open_uniform(bits.v[0]);
  }
  return model;
}

void generate_regression(const SyntheticSpec& spec, std::int64_t first, std::int64_t count, float* features,
                         float* targets) {
  const RegressionModel model = regression_model(spec);
  const std::int64_t width = spec.features, outputs = spec.outputs;
#pragma omp parallel for schedule(static) if (count * width * outputs > 16384)
  for (std::int64_t row = 0; row < count; ++row) {
    const std::int64_t sample = first + row;
    float* x = features + row * width;  // (F)
    NormalSequence position(spec.seed, Role::position, static_cast<std::uint64_t>(sample));
    for (std::int64_t j = 0; j < width; ++j) x[j] = static_cast<float>(position.next());
    NormalSequence noise(spec.seed, Role::target_noise, static_cast<std::uint64_t>(sample));
    for (std::int64_t k = 0; k < outputs; ++k) {
      double y = 0;
      for (int m = 0; m < regression_terms; ++m) {
        const std::int64_t term = k * regression_terms + m;
        const double* w = model.weights.data() + term * width;
        double projection = 0;
        // The stored (float) inputs, so the targets are exactly a function of what is in the file.
        for (std::int64_t j = 0; j < width; ++j) projection += w[j] * static_cast<double>(x[j]);
        y += model.amplitudes[static_cast<std::size_t>(term)] *
             std::sin(projection + model.phases[static_cast<std::size_t>(term)]);
      }
      targets[row * outputs + k] = static_cast<float>(y + spec.noise * noise.next());
    }
  }
}

// --- images ---

// 1 inside the class's shape or texture, 0 outside; (dx, dy) from the shape's centre in pixels, r its half-size.
// Lines are about 1.5 pixels wide, so every class shows at 16 x 16.
double shape_value(std::int32_t label, double dx, double dy, double r) {
  const double ax = std::abs(dx), ay = std::abs(dy), box = std::max(ax, ay), radius = std::hypot(dx, dy);
  constexpr double half_line = 0.75;
  switch (label) {
    case 0:  // cross (+)
      return (ax <= half_line || ay <= half_line) && box <= r ? 1.0 : 0.0;
    case 1:  // ring
      return std::abs(radius - r) <= half_line ? 1.0 : 0.0;
    case 2:  // filled square
      return box <= 0.8 * r ? 1.0 : 0.0;
    case 3:  // horizontal stripes in a square
      return box <= r && static_cast<std::int64_t>(std::floor((dy + r) / 1.5)) % 2 == 0 ? 1.0 : 0.0;
    case 4:  // vertical stripes in a square
      return box <= r && static_cast<std::int64_t>(std::floor((dx + r) / 1.5)) % 2 == 0 ? 1.0 : 0.0;
    case 5:  // diagonal cross (x)
      return std::abs(ax - ay) <= half_line && box <= r ? 1.0 : 0.0;
    case 6:  // filled disc
      return radius <= r ? 1.0 : 0.0;
    default:  // checkerboard of 2-pixel cells in a square
      return box <= r && (static_cast<std::int64_t>(std::floor((dx + r) / 2.0)) +
                          static_cast<std::int64_t>(std::floor((dy + r) / 2.0))) %
                                 2 ==
                             0
                 ? 1.0
                 : 0.0;
  }
}

void generate_images(const SyntheticSpec& spec, std::int64_t first, std::int64_t count, float* features,
                     std::int32_t* labels) {
  const std::int64_t size = spec.size, channels = spec.channels, width = channels * size * size;
  const double extent = static_cast<double>(size);
#pragma omp parallel for schedule(static) if (count * width > 65536)
  for (std::int64_t row = 0; row < count; ++row) {
    const std::int64_t sample = first + row;
    const std::int32_t label = label_of(spec, sample);
    const Philox4 bits = draw(spec.seed, Role::shape, 0, static_cast<std::uint64_t>(sample));
    const double r = extent * (0.18 + 0.14 * open_uniform(bits.v[0]));  // half-size: 18% to 32% of the image
    const double centre_x = r + (extent - 2 * r) * open_uniform(bits.v[1]);
    const double centre_y = r + (extent - 2 * r) * open_uniform(bits.v[2]);
    NormalSequence noise(spec.seed, Role::sample_noise, static_cast<std::uint64_t>(sample));
    float* image = features + row * width;  // (C, S, S)
    for (std::int64_t c = 0; c < channels; ++c) {
      const Philox4 brightness =
          draw(spec.seed, Role::shape, 1 + static_cast<std::uint32_t>(c / 4), static_cast<std::uint64_t>(sample));
      const double amplitude = 0.6 + 0.4 * open_uniform(brightness.v[c % 4]);
      for (std::int64_t y = 0; y < size; ++y)
        for (std::int64_t x = 0; x < size; ++x) {
          const double value = amplitude * shape_value(label, static_cast<double>(x) + 0.5 - centre_x,
                                                       static_cast<double>(y) + 0.5 - centre_y, r);
          image[(c * size + y) * size + x] = static_cast<float>(value + spec.noise * noise.next());
        }
    }
    labels[row] = label;
  }
}

// --- volumes ---

constexpr int volume_waves = 3;

void generate_volumes(const SyntheticSpec& spec, std::int64_t first, std::int64_t count, float* features,
                      float* targets) {
  const std::int64_t size = spec.size, channels = spec.channels, cube = size * size * size;
#pragma omp parallel for schedule(dynamic) if (count * channels * cube > 65536)
  for (std::int64_t row = 0; row < count; ++row) {
    const std::int64_t sample = first + row;
    // The targets, uniform in [-1, 1), and the field parameters they set.
    const Philox4 bits = draw(spec.seed, Role::parameters, 0, static_cast<std::uint64_t>(sample));
    double parameter[3];
    for (int k = 0; k < 3; ++k) parameter[k] = 2.0 * open_uniform(bits.v[k]) - 1.0;
    const double amplitude = 1.0 + 0.5 * parameter[0];
    const double frequency = 1.5 + 0.5 * parameter[1];  // cycles of the first wave across the volume
    const double slope = 1.0 + 0.75 * parameter[2];     // wave m has amplitude m^-slope and frequency m * frequency
    for (int k = 0; k < 3; ++k) targets[row * 3 + k] = static_cast<float>(parameter[k]);

    NormalSequence noise(spec.seed, Role::sample_noise, static_cast<std::uint64_t>(sample));
    float* volume = features + row * channels * cube;  // (C, S, S, S)
    for (std::int64_t c = 0; c < channels; ++c) {
      // Per channel: wave directions (unit vectors) and phases.
      NormalSequence directions(spec.seed, Role::waves,
                                static_cast<std::uint64_t>(sample) * static_cast<std::uint64_t>(channels + 1) +
                                    static_cast<std::uint64_t>(c));
      double wave[volume_waves][3], phase[volume_waves], weight[volume_waves];
      for (int m = 0; m < volume_waves; ++m) {
        double norm = 0;
        for (double& component : wave[m]) {
          component = directions.next();
          norm += component * component;
        }
        const double scale = 2.0 * std::numbers::pi * frequency * (m + 1) / std::sqrt(norm) / static_cast<double>(size);
        for (double& component : wave[m]) component *= scale;
        phase[m] = std::numbers::pi * directions.next();
        weight[m] = amplitude * std::pow(static_cast<double>(m + 1), -slope);
      }
      float* field = volume + c * cube;
      for (std::int64_t z = 0; z < size; ++z)
        for (std::int64_t y = 0; y < size; ++y)
          for (std::int64_t x = 0; x < size; ++x) {
            double value = 0;
            for (int m = 0; m < volume_waves; ++m)
              value += weight[m] * std::sin(wave[m][0] * static_cast<double>(z) + wave[m][1] * static_cast<double>(y) +
                                            wave[m][2] * static_cast<double>(x) + phase[m]);
            field[(z * size + y) * size + x] = static_cast<float>(value + spec.noise * noise.next());
          }
    }
  }
}

// --- writing ---

// A dataset of `rows` samples of shape `sample_shape` (empty: one value per sample), laid out for random row reads
// (io/hdf5.hpp: one extent, on a 2 MiB boundary when large).
H5Handle create_row_dataset(hid_t file, const char* path, hid_t stored_type, std::int64_t rows,
                            const std::vector<std::int64_t>& sample_shape) {
  std::vector<hsize_t> shape{static_cast<hsize_t>(rows)};
  for (auto extent : sample_shape) shape.push_back(static_cast<hsize_t>(extent));
  H5Handle space(HPCTRAIN_H5_CHECK(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr)));
  const H5Handle creation = row_dataset_layout();
  return H5Handle(
      HPCTRAIN_H5_CHECK(H5Dcreate2(file, path, stored_type, space.get(), H5P_DEFAULT, creation.get(), H5P_DEFAULT)));
}

void write_block(hid_t dataset, hid_t memory_type, std::int64_t first, std::int64_t count,
                 const std::vector<std::int64_t>& sample_shape, const void* values) {
  std::vector<hsize_t> start{static_cast<hsize_t>(first)}, block{static_cast<hsize_t>(count)};
  for (auto extent : sample_shape) {
    start.push_back(0);
    block.push_back(static_cast<hsize_t>(extent));
  }
  H5Handle file_space(HPCTRAIN_H5_CHECK(H5Dget_space(dataset)));
  HPCTRAIN_H5_CHECK(
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, block.data(), nullptr));
  H5Handle memory_space(HPCTRAIN_H5_CHECK(H5Screate_simple(static_cast<int>(block.size()), block.data(), nullptr)));
  HPCTRAIN_H5_CHECK(H5Dwrite(dataset, memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT, values));
}

}  // namespace

SyntheticKind parse_synthetic_kind(const std::string& name) {
  for (SyntheticKind kind : {SyntheticKind::blobs, SyntheticKind::spirals, SyntheticKind::regression,
                             SyntheticKind::images, SyntheticKind::volumes})
    if (name == synthetic_kind_name(kind)) return kind;
  throw InputError("unknown synthetic dataset kind '" + name + "'",
                   "the kinds are: blobs, spirals, regression, images, volumes");
}

const char* synthetic_kind_name(SyntheticKind kind) {
  switch (kind) {
    case SyntheticKind::blobs:
      return "blobs";
    case SyntheticKind::spirals:
      return "spirals";
    case SyntheticKind::regression:
      return "regression";
    case SyntheticKind::images:
      return "images";
    case SyntheticKind::volumes:
      return "volumes";
  }
  return "?";
}

std::vector<std::string> synthetic_kind_names() { return {"blobs", "spirals", "regression", "images", "volumes"}; }

bool is_classification(SyntheticKind kind) {
  return kind != SyntheticKind::regression && kind != SyntheticKind::volumes;
}

bool is_spatial(SyntheticKind kind) { return kind == SyntheticKind::images || kind == SyntheticKind::volumes; }

std::vector<std::int64_t> synthetic_sample_shape(const SyntheticSpec& spec) {
  if (spec.kind == SyntheticKind::images) return {spec.channels, spec.size, spec.size};
  if (spec.kind == SyntheticKind::volumes) return {spec.channels, spec.size, spec.size, spec.size};
  return {spec.features};
}

void set_spatial_extent(SyntheticSpec& spec, std::int64_t size, std::int64_t channels) {
  spec.size = size;
  spec.channels = channels;
  if (size <= 0 || channels <= 0 || size > 4096 || channels > 4096) return;  // validate_synthetic_spec reports it
  std::int64_t features = channels * size * size;
  if (spec.kind == SyntheticKind::volumes) features *= size;
  spec.features = features;
}

SyntheticSpec default_synthetic_spec(SyntheticKind kind) {
  SyntheticSpec spec;
  spec.kind = kind;
  switch (kind) {
    case SyntheticKind::blobs:
      spec.features = 2;
      spec.classes = 3;
      spec.noise = 1.0;
      break;
    case SyntheticKind::spirals:
      spec.features = 2;
      spec.classes = 3;
      spec.noise = 0.05;
      break;
    case SyntheticKind::regression:
      spec.features = 4;
      spec.outputs = 1;
      spec.noise = 0.1;
      break;
    case SyntheticKind::images:
      spec.classes = 4;
      spec.noise = 0.2;
      set_spatial_extent(spec, 16, 1);
      break;
    case SyntheticKind::volumes:
      spec.outputs = 3;
      spec.noise = 0.05;
      set_spatial_extent(spec, 16, 1);
      break;
  }
  return spec;
}

void validate_synthetic_spec(const SyntheticSpec& spec) {
  const char* kind = synthetic_kind_name(spec.kind);
  HPCTRAIN_VERIFY(spec.samples >= 1, InputError, "samples must be at least 1 (got " << spec.samples << ")");
  if (is_spatial(spec.kind)) {
    const std::int64_t min_size = spec.kind == SyntheticKind::images ? 8 : 4;
    const std::int64_t max_size = spec.kind == SyntheticKind::images ? 4096 : 512;
    HPCTRAIN_VERIFY(
        spec.size >= min_size && spec.size <= max_size, InputError,
        "size must be in [" << min_size << ", " << max_size << "] for " << kind << " (got " << spec.size << ")");
    HPCTRAIN_VERIFY(spec.channels >= 1 && spec.channels <= 64, InputError,
                    "channels must be in [1, 64] (got " << spec.channels << ")");
    HPCTRAIN_VERIFY(
        spec.kind != SyntheticKind::images || spec.classes <= image_classes_max, InputError,
        "images has at most " << image_classes_max << " classes (shapes and textures; got " << spec.classes << ")");
    HPCTRAIN_VERIFY(spec.kind != SyntheticKind::volumes || spec.outputs == 3, InputError,
                    "volumes always has 3 targets (amplitude, frequency, slope; got " << spec.outputs << ")");
    std::vector<std::int64_t> shape = synthetic_sample_shape(spec);
    std::int64_t features = 1;
    for (auto extent : shape) features *= extent;
    HPCTRAIN_ASSERT(spec.features == features, "features (" << spec.features << ") must equal channels x size^"
                                                            << shape.size() - 1 << " (use set_spatial_extent)");
  }
  const std::int64_t min_features = spec.kind == SyntheticKind::spirals ? 2 : 1;
  HPCTRAIN_VERIFY(spec.features >= min_features && spec.features <= max_features, InputError,
                  "features must be in [" << min_features << ", " << max_features << "] for " << kind << " (got "
                                          << spec.features << ")");
  if (is_classification(spec.kind)) {
    HPCTRAIN_VERIFY(spec.classes >= 2 && spec.classes <= max_classes, InputError,
                    "classes must be in [2, " << max_classes << "] (got " << spec.classes << ")");
  } else {
    HPCTRAIN_VERIFY(spec.outputs >= 1 && spec.outputs <= max_outputs, InputError,
                    "outputs must be in [1, " << max_outputs << "] (got " << spec.outputs << ")");
  }
  HPCTRAIN_VERIFY(std::isfinite(spec.noise) && spec.noise >= 0, InputError,
                  "noise must be a finite number >= 0 (got " << spec.noise << ")");
  HPCTRAIN_VERIFY(spec.seed <= static_cast<std::uint64_t>(INT64_MAX), InputError,
                  "seed must be in [0, 2^63) (got " << spec.seed << ")");
  HPCTRAIN_VERIFY(spec.problem_seed <= static_cast<std::uint64_t>(INT64_MAX), InputError,
                  "problem seed must be in [0, 2^63) (got " << spec.problem_seed << ")");
  const std::int64_t width = std::max(spec.features, is_classification(spec.kind) ? std::int64_t{1} : spec.outputs);
  HPCTRAIN_VERIFY(spec.samples <= (std::int64_t{1} << 62) / width, InputError,
                  spec.samples << " samples of " << width << " values is too many");
}

void generate_rows(const SyntheticSpec& spec, std::int64_t first, std::int64_t count, float* features,
                   std::int32_t* labels, float* targets) {
  HPCTRAIN_ASSERT(first >= 0 && count >= 0, "bad rows [" << first << ", " << first + count << ")");
  HPCTRAIN_ASSERT(features != nullptr && (is_classification(spec.kind) ? labels != nullptr : targets != nullptr),
                  "missing output buffer");
  switch (spec.kind) {
    case SyntheticKind::blobs:
      generate_blobs(spec, first, count, features, labels);
      break;
    case SyntheticKind::spirals:
      generate_spirals(spec, first, count, features, labels);
      break;
    case SyntheticKind::regression:
      generate_regression(spec, first, count, features, targets);
      break;
    case SyntheticKind::images:
      generate_images(spec, first, count, features, labels);
      break;
    case SyntheticKind::volumes:
      generate_volumes(spec, first, count, features, targets);
      break;
  }
}

void write_synthetic_dataset(const SyntheticSpec& spec, const std::string& path) {
  validate_synthetic_spec(spec);
  const auto lock = lock_hdf5();  // held throughout: generation is quick next to the writes
  const bool classification = is_classification(spec.kind);
  const std::int64_t rows = spec.samples, width = spec.features, outputs = spec.outputs;

  H5Handle file = create_data_file(path);
  const std::vector<std::int64_t> sample_shape = synthetic_sample_shape(spec);
  const std::vector<std::int64_t> target_shape{outputs};
  H5Handle features = create_row_dataset(file.get(), "/features", H5T_IEEE_F32LE, rows, sample_shape);
  H5Handle answers = classification ? create_row_dataset(file.get(), "/labels", H5T_STD_I32LE, rows, {})
                                    : create_row_dataset(file.get(), "/targets", H5T_IEEE_F32LE, rows, target_shape);

  // Blocks of at most ~16 MiB of features keep memory bounded for files of any size; whole 2 MiB pieces of the
  // features where the row size allows (io/hdf5.hpp).
  const std::int64_t block_rows =
      std::min(folio_block_rows(4 * std::max(width, outputs), std::int64_t{16} << 20), rows);
  std::vector<float> feature_block(static_cast<std::size_t>(block_rows * width));                        // (block, F)
  std::vector<std::int32_t> label_block(classification ? static_cast<std::size_t>(block_rows) : 0);      // (block)
  std::vector<float> target_block(classification ? 0 : static_cast<std::size_t>(block_rows * outputs));  // (block, K)
  for (std::int64_t first = 0; first < rows; first += block_rows) {
    const std::int64_t count = std::min(block_rows, rows - first);
    generate_rows(spec, first, count, feature_block.data(), label_block.data(), target_block.data());
    write_block(features.get(), H5T_NATIVE_FLOAT, first, count, sample_shape, feature_block.data());
    if (classification) {
      write_block(answers.get(), H5T_NATIVE_INT32, first, count, {}, label_block.data());
    } else {
      write_block(answers.get(), H5T_NATIVE_FLOAT, first, count, target_shape, target_block.data());
    }
  }

  const hid_t root = file.get();
  write_string_attribute(root, "kind", synthetic_kind_name(spec.kind));
  write_integer_attribute(root, "seed", static_cast<std::int64_t>(spec.seed));
  write_integer_attribute(root, "problem_seed", static_cast<std::int64_t>(spec.problem_seed));
  write_integer_attribute(root, "samples", rows);
  write_integer_attribute(root, "features", width);
  if (classification) {
    write_integer_attribute(root, "classes", spec.classes);
  } else {
    write_integer_attribute(root, "outputs", outputs);
  }
  if (is_spatial(spec.kind)) {
    write_integer_attribute(root, "size", spec.size);
    write_integer_attribute(root, "channels", spec.channels);
  }
  write_float_attribute(root, "noise", spec.noise);
  write_string_attribute(root, "created_by", std::string("hpctrain ") + HPCTRAIN_VERSION);

  features.close();
  answers.close();
  file.close();  // a failed close means a bad file: report it
}

}  // namespace hpctrain
