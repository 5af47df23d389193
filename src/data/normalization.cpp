// The standardisation statistics file: written by `data inspect --stats-out`, read for data.normalize.
#include "hpctrain/data/normalization.hpp"

#include <cmath>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/data/hdf5_dataset.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

namespace {

void write_vector(hid_t file, const char* name, hid_t file_type, hid_t memory_type, std::size_t count,
                  const void* values) {
  const hsize_t dims[1] = {static_cast<hsize_t>(count)};
  const H5Handle space(HPCTRAIN_H5_CHECK(H5Screate_simple(1, dims, nullptr)));
  const H5Handle dataset(
      HPCTRAIN_H5_CHECK(H5Dcreate2(file, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  HPCTRAIN_H5_CHECK(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values));
}

std::vector<double> read_vector(const std::string& file, const std::string& path, const std::string& where) {
  std::unique_ptr<Hdf5Dataset> dataset;
  try {
    dataset = std::make_unique<Hdf5Dataset>(file, path);
  } catch (const InputError& error) {
    throw InputError(where + ": data.normalize = \"" + file + "\": " + error.what(),
                     "write the file with 'hpctrain data inspect TRAIN.h5 --stats-out " + file + "'");
  }
  HPCTRAIN_VERIFY(dataset->shape().size() == 1, InputError,
                  where << ": data.normalize = \"" << file << "\": " << path << " has shape "
                        << shape_text(dataset->shape()) << "; expected one value per channel (C)",
                  "write the file with 'hpctrain data inspect TRAIN.h5 --stats-out " + file + "'");
  std::vector<double> values(static_cast<std::size_t>(dataset->samples()));
  if (!values.empty()) dataset->read_range(0, dataset->samples(), values.data());
  return values;
}

}  // namespace

std::vector<std::size_t> write_normalization_file(const std::string& path, const std::string& source,
                                                  const std::string& features,
                                                  const std::vector<ChannelStatistics>& channels) {
  std::vector<double> mean, std;
  std::vector<std::int64_t> count;
  std::vector<std::size_t> constant;
  for (std::size_t c = 0; c < channels.size(); ++c) {
    const ChannelStatistics& channel = channels[c];
    HPCTRAIN_VERIFY(channel.count > 0, InputError,
                    "channel " << c << " of '" << features << "' in '" << source
                               << "' has no finite values: no statistics to write to '" << path << "'",
                    "clean the data first ('hpctrain data inspect' shows which channels hold NaN or Inf)");
    double deviation = channel.standard_deviation();
    if (!(deviation > 0)) {
      deviation = 1.0;
      constant.push_back(c);
    }
    mean.push_back(channel.mean);
    std.push_back(deviation);
    count.push_back(channel.count);
  }
  const auto lock = lock_hdf5();
  const H5Handle file = create_file(path);
  write_vector(file.get(), "mean", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, mean.size(), mean.data());
  write_vector(file.get(), "std", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, std.size(), std.data());
  write_vector(file.get(), "count", H5T_STD_I64LE, H5T_NATIVE_INT64, count.size(), count.data());
  write_string_attribute(file.get(), "source", source);
  write_string_attribute(file.get(), "features", features);
  write_integer_attribute(file.get(), "constant_channels", static_cast<std::int64_t>(constant.size()));
  return constant;
}

NormalizationValues read_normalization_file(const std::string& file, const std::string& where) {
  const std::vector<double> mean = read_vector(file, "/mean", where);
  const std::vector<double> std = read_vector(file, "/std", where);
  HPCTRAIN_VERIFY(mean.size() == std.size() && !mean.empty(), InputError,
                  where << ": data.normalize = \"" << file << "\": /mean has " << mean.size() << " values and /std "
                        << std.size() << "; expected the same number, one per channel",
                  "rewrite the file with 'hpctrain data inspect TRAIN.h5 --stats-out " + file + "'");
  for (std::size_t c = 0; c < std.size(); ++c) {
    HPCTRAIN_VERIFY(std::isfinite(mean[c]) && std::isfinite(std[c]) && std[c] > 0, InputError,
                    where << ": data.normalize = \"" << file << "\": channel " << c << " has mean " << mean[c]
                          << " and std " << std[c] << "; the std must be positive and both finite",
                    "a constant channel needs std 1 (then only its mean is subtracted); 'hpctrain data inspect "
                    "--stats-out' writes it so");
  }
  return {mean, std};
}

void resolve_normalization(RunConfig& config) {
  if (config.data.normalize.empty()) return;
  NormalizationValues values = read_normalization_file(config.data.normalize, config.where("data.normalize"));
  config.data.mean = std::move(values.mean);
  config.data.std = std::move(values.std);
  config.data.normalized_from = config.data.normalize;
  config.data.normalize.clear();
}

}  // namespace hpctrain
