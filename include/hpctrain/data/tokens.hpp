// Token data for language models: one HDF5 file holds a 1-D stream /tokens of token ids (uint8, uint16 or int32: the
// smallest type that holds ids below the vocabulary size), with the attributes vocabulary_size (required) and
// sequence_length (optional: a default T for decks) on the root. Sample i of a file is the window of T + 1 tokens
// starting at token i x T: the first T are the model's input, the last T its targets (the input shifted by one). A
// stream of n tokens has (n - 1) / T windows (rounded down); windows never cross files.
//
// Writers: `hpctrain data convert --text` (byte-level, vocabulary 256) and `--tokens X.npy --vocabulary V` (ids from
// any tokenizer). Readers: TrainingData (data/training_data.hpp) and `hpctrain data inspect`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hpctrain {

inline constexpr const char* tokens_dataset = "/tokens";
inline constexpr const char* vocabulary_attribute = "vocabulary_size";
inline constexpr const char* sequence_length_attribute = "sequence_length";
// The largest vocabulary: ids are stored (at most) as int32 and read as int32.
inline constexpr std::int64_t max_vocabulary = 2147483647;

// The stored type for ids below `vocabulary`: "uint8" up to 256, "uint16" up to 65,536, else "int32".
std::string token_type_for(std::int64_t vocabulary);

// Windows of T + 1 tokens at a stride of T in a stream of `tokens`: (tokens - 1) / T, 0 when fewer than T + 1.
constexpr std::int64_t token_windows(std::int64_t tokens, std::int64_t sequence_length) {
  return tokens > sequence_length ? (tokens - 1) / sequence_length : 0;
}

// Whether `file` holds token data (a /tokens dataset). Throws InputError when it is not a readable HDF5 file.
bool file_holds_tokens(const std::string& file);

// What a token file's metadata says (no token read). Throws InputError naming the file when /tokens is not a 1-D
// integer dataset or vocabulary_size is missing or out of range.
struct TokenFileInfo {
  std::int64_t tokens = 0;
  std::int64_t vocabulary = 0;
  std::int64_t sequence_length = 0;  // 0: no attribute
  std::string type_name;             // the stored type, as io/hdf5.hpp names it
};
TokenFileInfo read_token_file_info(const std::string& file);

// How often each id occurs in a token file's stream (`hpctrain data inspect`), read in bounded blocks.
struct TokenCounts {
  std::vector<std::int64_t> counts;      // (vocabulary) occurrences of each id
  std::int64_t tokens = 0;               // in the stream
  std::int64_t out_of_range = 0;         // ids outside [0, vocabulary), not in counts
  std::int64_t first_out_of_range = -1;  // its position, -1 when none

  [[nodiscard]] std::int64_t ids_used() const;
  // The unigram entropy in bits per token, -sum p log2 p over the ids' frequencies: the cross-entropy of the best
  // model that ignores context, the baseline a language model must beat (x ln 2 for nats, the training loss's unit).
  [[nodiscard]] double entropy_bits() const;
};
TokenCounts count_tokens(const std::string& file, const TokenFileInfo& info);

// `hpctrain data convert --text` / `--tokens`. The last round(validation_fraction x n) tokens of the stream go to
// `validation_output` (its own token file, with the same attributes), the rest to `output`; no validation file when
// the fraction is 0. Both stream in bounded blocks. Return a one-line summary.
struct TokenConversion {
  std::vector<std::string> texts;    // byte-level: the files' bytes, concatenated in order; vocabulary 256
  std::string ids;                   // or a .npy of integer ids (any shape, read flattened in C order)
  std::int64_t vocabulary = 0;       // with ids: every id must be below it
  std::int64_t sequence_length = 0;  // written as the attribute when > 0
  double validation_fraction = 0.0;
  bool compress = false;
};
std::string convert_tokens(const TokenConversion& conversion, const std::string& output,
                           const std::string& validation_output);

}  // namespace hpctrain
