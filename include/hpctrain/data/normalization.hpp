// Per-channel standardisation statistics: the file `hpctrain data inspect --stats-out` writes (/mean, /std, /count,
// float64 and int64, one value per channel of the features) and the deck's data.normalize reads.
#pragma once

#include <string>
#include <vector>

#include "hpctrain/data/channel_statistics.hpp"

namespace hpctrain {

struct RunConfig;

// Writes the statistics of `source`'s dataset `features` (root only; no MPI). A constant channel (std 0) gets std 1,
// so that standardising it only subtracts its mean; returns those channels.
std::vector<std::size_t> write_normalization_file(const std::string& path, const std::string& source,
                                                  const std::string& features,
                                                  const std::vector<ChannelStatistics>& channels);

// The /mean and /std of a statistics file; `where` ("deck.toml:7:1") and the file start every message. Throws
// InputError (missing file or dataset, different lengths, a std that is not positive, a value that is not finite).
struct NormalizationValues {
  std::vector<double> mean, std;
};
NormalizationValues read_normalization_file(const std::string& file, const std::string& where);

// When data.normalize names a file: reads its /mean and /std into data.mean and data.std and clears data.normalize,
// so that OUTPUT/config.toml and checkpoints carry the values themselves. Throws InputError naming the file and key
// (missing file, missing dataset, different lengths, a std that is not positive).
void resolve_normalization(RunConfig& config);

}  // namespace hpctrain
