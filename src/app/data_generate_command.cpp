// `hpctrain data generate`: a synthetic dataset (blobs, spirals, regression, images, volumes) written by rank 0.
#include <cstdio>
#include <sstream>

#include "data_tools.hpp"
#include "hpctrain/app/command_line.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/data/generate.hpp"
#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

namespace {

const char* const generate_usage =
    "usage: hpctrain data generate KIND --samples N --output FILE.h5 [options]\n"
    "\n"
    "Write a synthetic dataset. Every value is a pure function of the options and the seeds: the same command writes\n"
    "the same data. --problem-seed picks the problem (the blob centres, the regression weights, the plane of spirals\n"
    "with F > 2) and --seed the samples drawn from it, so a training and a validation file of one problem differ in\n"
    "--seed only, e.g. --seed 1 and --seed 2 (or write one file and cut it with 'hpctrain data split').\n"
    "\n"
    "kinds:\n"
    "  blobs       C Gaussian clusters, centres uniform in [-10, 10]^F; --noise is each cluster's standard deviation\n"
    "  spirals     C interleaved spiral arms of radius 1; --noise is the standard deviation added to every feature;\n"
    "              with --features F > 2 the spirals lie in a random plane of R^F\n"
    "  regression  inputs x ~ N(0, 1)^F; K smooth nonlinear targets, each a sum of 4 random sine waves of x, plus\n"
    "              Gaussian noise of standard deviation --noise\n"
    "  images      (C, S, S) images, each holding one shape or texture (its class: cross, ring, square, horizontal\n"
    "              stripes, vertical stripes, diagonal cross, disc, checkerboard; --classes picks the first C of\n"
    "              these, at most 8) at a random place, size and brightness, plus pixel noise of std --noise\n"
    "  volumes     (C, S, S, S) fields for 3-D CNN regression: per channel a sum of 3 plane waves in random\n"
    "              directions; 3 targets in [-1, 1] set the field's amplitude, frequency and spectral slope\n"
    "              (CosmoFlow-like: recover the parameters from the field); pixel noise of std --noise\n"
    "\n"
    "options:\n"
    "  --samples N       number of samples (required)\n"
    "  --output FILE.h5  file to write (required); written as FILE.h5.partial and renamed when complete\n"
    "  --features F      values per sample (default 2; regression 4)\n"
    "  --classes C       number of classes, blobs and spirals (default 3)\n"
    "  --outputs K       targets per sample, regression (default 1)\n"
    "  --size S          edge length of images and volumes (default 16)\n"
    "  --channels C      channels of images and volumes (default 1)\n"
    "  --noise X         noise level (default: blobs 1, spirals 0.05, regression 0.1, images 0.2, volumes 0.05)\n"
    "  --seed S          seed of the samples (labels, positions, noise), 0 <= S < 2^63 (default 0)\n"
    "  --problem-seed P  seed of the problem the samples come from, 0 <= P < 2^63 (default 0); images and volumes\n"
    "                    have no per-problem values, and neither have spirals with F = 2. Files written before\n"
    "                    this option existed are written again with --problem-seed equal to their --seed\n"
    "  --force           replace FILE.h5 if it exists\n"
    "  --help            show this help\n"
    "\n"
    "The file holds /features (N, F) float32 ((N, C, S, S) for images, (N, C, S, S, S) for volumes) and /labels (N)\n"
    "int32 in [0, C), or /targets (N, K) float32 for regression and volumes (K = 3), with the options recorded as\n"
    "attributes of the root.\n";

}  // namespace

int data_generate_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data generate";
  const CommandLine parsed(args, command,
                           {{"--samples", true},
                            {"--features", true},
                            {"--classes", true},
                            {"--outputs", true},
                            {"--size", true},
                            {"--channels", true},
                            {"--noise", true},
                            {"--seed", true},
                            {"--problem-seed", true},
                            {"--output", true},
                            {"--force", false}});
  if (print_help_if_asked(parsed, generate_usage, mpi)) return 0;
  const std::string help_hint = parsed.help_hint();
  HPCTRAIN_VERIFY(!parsed.positionals().empty(), InputError, command << ": no dataset kind given",
                  "the kinds are blobs, spirals, regression, images and volumes; " + help_hint);
  HPCTRAIN_VERIFY(parsed.positionals().size() == 1, InputError,
                  command << ": unexpected argument '" << parsed.positionals()[1] << "' (one kind only)", help_hint);
  SyntheticKind kind{};
  try {
    kind = parse_synthetic_kind(parsed.positionals()[0]);
  } catch (const InputError& error) {
    throw InputError(command + ": " + error.what(), error.hint());
  }
  const char* kind_name = synthetic_kind_name(kind);
  HPCTRAIN_VERIFY(parsed.has("--samples"), InputError, command << ": --samples N is required", help_hint);
  HPCTRAIN_VERIFY(parsed.has("--output"), InputError, command << ": --output FILE.h5 is required", help_hint);
  HPCTRAIN_VERIFY(!(is_classification(kind) && parsed.has("--outputs")), InputError,
                  command << ": --outputs applies to regression data, not " << kind_name << " (which has --classes)",
                  help_hint);
  HPCTRAIN_VERIFY(!(!is_classification(kind) && parsed.has("--classes")), InputError,
                  command << ": --classes applies to blobs, spirals and images, not " << kind_name
                          << (kind == SyntheticKind::regression ? " (which has --outputs)" : ""),
                  help_hint);
  HPCTRAIN_VERIFY(!(kind == SyntheticKind::volumes && parsed.has("--outputs")), InputError,
                  command << ": volumes always has 3 targets (amplitude, frequency, slope); --outputs does not apply",
                  help_hint);
  for (const char* option : {"--size", "--channels"})
    HPCTRAIN_VERIFY(
        is_spatial(kind) || !parsed.has(option), InputError,
        command << ": " << option << " applies to images and volumes, not " << kind_name << " (which has --features)",
        help_hint);
  HPCTRAIN_VERIFY(!(is_spatial(kind) && parsed.has("--features")), InputError,
                  command << ": " << kind_name << " samples are shaped by --size and --channels, not --features",
                  help_hint);

  SyntheticSpec spec = default_synthetic_spec(kind);
  spec.samples = parsed.integer<std::int64_t>("--samples");
  if (parsed.has("--features")) spec.features = parsed.integer<std::int64_t>("--features");
  if (parsed.has("--classes")) spec.classes = parsed.integer<std::int64_t>("--classes");
  if (parsed.has("--outputs")) spec.outputs = parsed.integer<std::int64_t>("--outputs");
  if (is_spatial(kind))
    set_spatial_extent(spec, parsed.has("--size") ? parsed.integer<std::int64_t>("--size") : spec.size,
                       parsed.has("--channels") ? parsed.integer<std::int64_t>("--channels") : spec.channels);
  if (parsed.has("--noise")) spec.noise = parsed.number("--noise");
  if (parsed.has("--seed")) spec.seed = parsed.integer<std::uint64_t>("--seed");
  if (parsed.has("--problem-seed")) spec.problem_seed = parsed.integer<std::uint64_t>("--problem-seed");
  try {
    validate_synthetic_spec(spec);
  } catch (const InputError& error) {
    throw InputError(command + ": " + error.what(), help_hint);
  }
  const std::string output = parsed.value("--output");

  if (mpi.is_root()) {
    write_output_file(parsed, "--output", output,
                      [&](const std::string& partial) { write_synthetic_dataset(spec, partial); });

    std::ostringstream line;
    std::string shape;
    for (auto extent : synthetic_sample_shape(spec)) shape += ", " + std::to_string(extent);
    line << "wrote " << output << ": " << spec.samples << " samples of " << kind_name << " (" << spec.features
         << " features, ";
    if (is_classification(kind)) {
      line << spec.classes << " classes";
    } else {
      line << spec.outputs << " outputs";
    }
    line << ", noise " << spec.noise << ", seed " << spec.seed << ", problem seed " << spec.problem_seed
         << "): /features (" << spec.samples << shape << ") float32, ";
    if (is_classification(kind)) {
      line << "/labels (" << spec.samples << ") int32";
    } else {
      line << "/targets (" << spec.samples << ", " << spec.outputs << ") float32";
    }
    std::printf("%s\n", line.str().c_str());
    std::fflush(stdout);
  }
  wait_for_root(mpi);
  return 0;
}

}  // namespace hpctrain
