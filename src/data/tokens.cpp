// Token files: the stored type for a vocabulary and the metadata readers (docs/file-formats.md, "Token data").
#include "hpctrain/data/tokens.hpp"

#include <algorithm>
#include <cmath>

#include "hpctrain/core/error.hpp"
#include "hpctrain/data/hdf5_dataset.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

std::string token_type_for(std::int64_t vocabulary) {
  if (vocabulary <= 256) return "uint8";
  if (vocabulary <= 65536) return "uint16";
  return "int32";
}

bool file_holds_tokens(const std::string& file) {
  const auto lock = lock_hdf5();
  const H5Handle handle = open_file_read_only(file, "data file");
  return link_exists(handle.get(), tokens_dataset);
}

TokenFileInfo read_token_file_info(const std::string& file) {
  const auto lock = lock_hdf5();
  const H5Handle handle = open_file_read_only(file, "data file");
  const std::string hint =
      "token files hold a 1-D integer /tokens and a vocabulary_size attribute on the root; 'hpctrain data convert "
      "--text' or '--tokens X.npy --vocabulary V' writes them (docs/file-formats.md)";
  HPCTRAIN_VERIFY(link_exists(handle.get(), tokens_dataset), InputError,
                  "'" << file << "' has no dataset " << tokens_dataset, hint);
  const H5Handle dataset = open_dataset(handle.get(), tokens_dataset);
  const H5Handle space(HPCTRAIN_H5_CHECK(H5Dget_space(dataset.get())));
  const H5Handle type(HPCTRAIN_H5_CHECK(H5Dget_type(dataset.get())));
  TokenFileInfo info;
  info.type_name = type_name(type.get());
  const std::vector<std::int64_t> shape = dataspace_shape(space.get());
  HPCTRAIN_VERIFY(shape.size() == 1 && H5Tget_class(type.get()) == H5T_INTEGER, InputError,
                  "'" << file << "': " << tokens_dataset << " has shape " << shape_text(shape) << " and type "
                      << info.type_name << "; token ids are a 1-D integer stream",
                  hint);
  info.tokens = shape[0];
  HPCTRAIN_VERIFY(attribute_exists(handle.get(), vocabulary_attribute), InputError,
                  "'" << file << "' has no '" << vocabulary_attribute << "' attribute (the number of token ids)", hint);
  const double vocabulary = read_number_attribute(handle.get(), vocabulary_attribute);
  HPCTRAIN_VERIFY(vocabulary >= 1 && vocabulary <= static_cast<double>(max_vocabulary) &&
                      vocabulary == static_cast<double>(static_cast<std::int64_t>(vocabulary)),
                  InputError,
                  "'" << file << "': " << vocabulary_attribute << " = " << vocabulary
                      << " is not a whole number in [1, " << max_vocabulary << "]",
                  hint);
  info.vocabulary = static_cast<std::int64_t>(vocabulary);
  if (attribute_exists(handle.get(), sequence_length_attribute)) {
    const double length = read_number_attribute(handle.get(), sequence_length_attribute);
    HPCTRAIN_VERIFY(
        length >= 1 && length <= 2147483647.0 && length == static_cast<double>(static_cast<std::int64_t>(length)),
        InputError,
        "'" << file << "': " << sequence_length_attribute << " = " << length << " is not a whole number >= 1", hint);
    info.sequence_length = static_cast<std::int64_t>(length);
  }
  return info;
}

std::int64_t TokenCounts::ids_used() const {
  return std::count_if(counts.begin(), counts.end(), [](std::int64_t count) { return count > 0; });
}

double TokenCounts::entropy_bits() const {
  const double counted = static_cast<double>(tokens - out_of_range);
  double entropy = 0;
  for (const std::int64_t count : counts)
    if (count > 0) {
      const double p = static_cast<double>(count) / counted;
      entropy -= p * std::log2(p);
    }
  return entropy;
}

TokenCounts count_tokens(const std::string& file, const TokenFileInfo& info) {
  constexpr std::int64_t block = 1 << 20;  // tokens per read: 4 MiB whatever the file size
  Hdf5Dataset dataset(file, tokens_dataset);
  TokenCounts result;
  result.counts.assign(static_cast<std::size_t>(info.vocabulary), 0);
  result.tokens = dataset.samples();
  std::vector<std::int32_t> ids(static_cast<std::size_t>(std::min(block, std::max<std::int64_t>(result.tokens, 1))));
  for (std::int64_t first = 0; first < result.tokens; first += block) {
    const std::int64_t count = std::min(block, result.tokens - first);
    dataset.read_range(first, count, ids.data());
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int32_t id = ids[static_cast<std::size_t>(i)];
      if (id >= 0 && id < info.vocabulary) {
        ++result.counts[static_cast<std::size_t>(id)];
      } else if (result.out_of_range++ == 0) {
        result.first_out_of_range = first + i;
      }
    }
  }
  return result;
}

}  // namespace hpctrain
