// The .npy header: magic, version, header length, then a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (1000, 28, 28), }
// padded with spaces and a newline. We parse that literal with a small recursive-descent reader of the few forms
// NumPy writes (strings, True/False, tuples of integers), rather than evaluating anything.
#include "hpctrain/data/npy.hpp"

#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"

namespace hpctrain {

namespace {

constexpr std::string_view npy_magic = "\x93NUMPY";
const char* const npy_hint = "write the array with numpy.save(path, numpy.ascontiguousarray(array)); see docs/data.md";

struct ElementType {
  std::string_view descr, type_name;
  std::size_t bytes;
  bool is_float, is_signed;
};

constexpr ElementType element_types[] = {
    {"<f2", "float16", 2, true, true},  {"<f4", "float32", 4, true, true},  {"<f8", "float64", 8, true, true},
    {"|i1", "int8", 1, false, true},    {"<i2", "int16", 2, false, true},   {"<i4", "int32", 4, false, true},
    {"<i8", "int64", 8, false, true},   {"|u1", "uint8", 1, false, false},  {"<u2", "uint16", 2, false, false},
    {"<u4", "uint32", 4, false, false}, {"<u8", "uint64", 8, false, false},
};

// A value of the header dict.
struct Literal {
  enum class Kind { string, boolean, tuple, other } kind = Kind::other;
  std::string text;                  // string
  bool flag = false;                 // boolean
  std::vector<std::int64_t> values;  // tuple of integers
};

class HeaderReader {
 public:
  HeaderReader(std::string_view text, const std::string& file) : text_(text), file_(file) {}

  std::map<std::string, Literal> read_dict() {
    std::map<std::string, Literal> entries;
    expect('{');
    while (true) {
      skip_spaces();
      if (peek() == '}') break;
      const std::string key = read_string();
      expect(':');
      entries[key] = read_value();
      skip_spaces();
      if (peek() == ',') {
        ++position_;
        continue;
      }
      if (peek() != '}') fail("expected ',' or '}' after the value of '" + key + "'");
    }
    ++position_;
    return entries;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw InputError("'" + file_ + "' is not a valid .npy file: bad header (" + problem + " at character " +
                         std::to_string(position_) + " of '" + std::string(text_) + "')",
                     npy_hint);
  }
  void skip_spaces() {
    while (position_ < text_.size() && (text_[position_] == ' ' || text_[position_] == '\t')) ++position_;
  }
  char peek() {
    skip_spaces();
    return position_ < text_.size() ? text_[position_] : '\0';
  }
  void expect(char wanted) {
    if (peek() != wanted) fail(std::string("expected '") + wanted + "'");
    ++position_;
  }
  std::string read_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted key");
    const std::size_t end = text_.find(quote, position_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string value(text_.substr(position_ + 1, end - position_ - 1));
    position_ = end + 1;
    return value;
  }
  std::int64_t read_integer() {
    skip_spaces();
    std::int64_t value = 0;
    const auto [end, error] = std::from_chars(text_.data() + position_, text_.data() + text_.size(), value);
    if (error != std::errc() || value < 0) fail("expected a dimension (a whole number >= 0)");
    position_ = static_cast<std::size_t>(end - text_.data());
    if (position_ < text_.size() && text_[position_] == 'L') ++position_;  // Python 2 long integers: (10L, 3L)
    return value;
  }
  Literal read_value() {
    Literal value;
    const char first = peek();
    if (first == '\'' || first == '"') {
      value.kind = Literal::Kind::string;
      value.text = read_string();
    } else if (text_.substr(position_, 4) == "True") {
      value.kind = Literal::Kind::boolean;
      value.flag = true;
      position_ += 4;
    } else if (text_.substr(position_, 5) == "False") {
      value.kind = Literal::Kind::boolean;
      position_ += 5;
    } else if (first == '(') {
      value.kind = Literal::Kind::tuple;
      ++position_;
      while (peek() != ')') {
        value.values.push_back(read_integer());
        if (peek() == ',') {
          ++position_;
        } else if (peek() != ')') {
          fail("expected ',' or ')' in the shape");
        }
      }
      ++position_;
    } else if (first == '[') {
      // A list descr is a structured type: skip to its end so that the caller can say so.
      int depth = 0;
      do {
        if (position_ >= text_.size()) fail("unterminated list");
        if (text_[position_] == '[') ++depth;
        if (text_[position_] == ']') --depth;
        ++position_;
      } while (depth > 0);
    } else {
      fail("expected a string, True, False or a tuple");
    }
    return value;
  }

  std::string_view text_;
  const std::string& file_;
  std::size_t position_ = 0;
};

std::uint32_t little_endian(std::string_view bytes, std::size_t offset, std::size_t count) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < count; ++i)
    value |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  return value;
}

}  // namespace

std::int64_t NpyHeader::elements() const {
  std::int64_t count = 1;
  for (const std::int64_t dimension : shape) count *= dimension;
  return count;
}

NpyHeader parse_npy_header(std::string_view bytes, const std::string& file) {
  HPCTRAIN_VERIFY(bytes.size() >= 10 && bytes.substr(0, 6) == npy_magic, InputError,
                  "'" << file << "' is not a .npy file (it does not start with \\x93NUMPY)", npy_hint);
  const int major = static_cast<unsigned char>(bytes[6]);
  HPCTRAIN_VERIFY(major >= 1 && major <= 3, InputError,
                  "'" << file << "' is a .npy file of format version " << major << "." << int{bytes[7]}
                      << ", which hpctrain does not know (it reads 1.0, 2.0 and 3.0)",
                  npy_hint);
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  HPCTRAIN_VERIFY(bytes.size() >= 8 + length_bytes, InputError, "'" << file << "' is truncated inside its header",
                  npy_hint);
  const std::size_t header_length = little_endian(bytes, 8, length_bytes);
  const std::size_t header_start = 8 + length_bytes;
  HPCTRAIN_VERIFY(bytes.size() >= header_start + header_length, InputError,
                  "'" << file << "' is truncated inside its header (" << header_length << " header bytes announced)",
                  npy_hint);
  std::string_view text = bytes.substr(header_start, header_length);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0')) text.remove_suffix(1);

  const auto entries = HeaderReader(text, file).read_dict();
  const auto missing = [&](const char* key) {
    return InputError(
        "'" + file + "' is not a valid .npy file: bad header (no '" + key + "' in '" + std::string(text) + "')",
        npy_hint);
  };
  const auto descr = entries.find("descr");
  const auto fortran = entries.find("fortran_order");
  const auto shape = entries.find("shape");
  if (descr == entries.end()) throw missing("descr");
  if (fortran == entries.end()) throw missing("fortran_order");
  if (shape == entries.end()) throw missing("shape");
  HPCTRAIN_VERIFY(descr->second.kind == Literal::Kind::string, InputError,
                  "'" << file << "' holds a structured array (fields with names); hpctrain reads plain numeric arrays",
                  "save each field as its own .npy file, e.g. numpy.save('x.npy', array['x'])");
  HPCTRAIN_VERIFY(fortran->second.kind == Literal::Kind::boolean && shape->second.kind == Literal::Kind::tuple,
                  InputError,
                  "'" << file
                      << "' is not a valid .npy file: bad header ('fortran_order' must be True or False and "
                         "'shape' a tuple, in '"
                      << text << "')",
                  npy_hint);
  HPCTRAIN_VERIFY(!fortran->second.flag, InputError,
                  "'" << file << "' stores its array in Fortran (column-major) order; hpctrain reads C order",
                  "save it as numpy.save(path, numpy.ascontiguousarray(array))");

  NpyHeader header;
  header.descr = descr->second.text;
  header.shape = shape->second.values;
  header.data_offset = header_start + header_length;
  std::string descr_text = header.descr;
  if (descr_text.size() == 3 && descr_text[0] == '=') descr_text[0] = '<';  // native order on this little-endian host
  if (descr_text.size() == 3 && descr_text[0] == '<' && descr_text[2] == '1') descr_text[0] = '|';
  const ElementType* type = nullptr;
  for (const auto& candidate : element_types)
    if (candidate.descr == descr_text) type = &candidate;
  if (type == nullptr) {
    const bool big_endian = !header.descr.empty() && header.descr[0] == '>';
    throw InputError("'" + file + "' holds elements of type '" + header.descr + "'" +
                         (big_endian ? " (big-endian)" : "") + ", which hpctrain does not convert",
                     big_endian ? "convert it to little-endian first: numpy.save(path, array.astype(array.dtype."
                                  "newbyteorder('<')))"
                                : "supported: float16/32/64, int8/16/32/64, uint8/16/32/64 ('<f4', '|u1', ...); "
                                  "e.g. numpy.save(path, array.astype(numpy.float32))");
  }
  header.type_name = type->type_name;
  header.value_bytes = type->bytes;
  header.is_float = type->is_float;
  header.is_signed = type->is_signed;
  return header;
}

NpyHeader read_npy_header(const std::string& file) {
  require_regular_file(file, "NumPy file");
  std::ifstream stream(file, std::ios::binary);
  HPCTRAIN_VERIFY(stream, InputError, "cannot read '" << file << "'", "check the file's permissions");
  // The header is at most a few kilobytes (version 1 headers at most 65535 + 10 bytes); read what there is of 1 MiB.
  std::string start(1 << 20, '\0');
  stream.read(start.data(), static_cast<std::streamsize>(start.size()));
  start.resize(static_cast<std::size_t>(stream.gcount()));
  NpyHeader header = parse_npy_header(start, file);

  std::error_code error;
  const auto size = std::filesystem::file_size(file, error);
  const std::uintmax_t expected =
      header.data_offset + static_cast<std::uintmax_t>(header.elements()) * header.value_bytes;
  HPCTRAIN_VERIFY(!error && size == expected, InputError,
                  "'" << file << "' should hold " << expected << " bytes for its shape, but has " << size
                      << (size < expected ? " (truncated?)" : " (extra bytes after the array)"),
                  npy_hint);
  return header;
}

}  // namespace hpctrain
