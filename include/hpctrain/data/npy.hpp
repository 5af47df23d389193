// NumPy .npy files: the header (format versions 1.0, 2.0 and 3.0) parsed by hand, so `hpctrain data convert` needs no
// Python. The data that follows the header is read by the caller, block by block, as raw little-endian values.
//
// Supported element types: '<f2' '<f4' '<f8' '|i1' '<i2' '<i4' '<i8' '|u1' '<u2' '<u4' '<u8', C order. Fortran order,
// big-endian or structured types and malformed headers are InputErrors that name the file and say what to do.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hpctrain {

struct NpyHeader {
  std::string descr;                // as written: "<f4", "|u1", ...
  std::string type_name;            // as io/hdf5.hpp names types: "float32", "uint8", ...
  std::size_t value_bytes = 0;      // bytes per element
  bool is_float = false;            // floating point (else integer)
  bool is_signed = false;           // integers
  std::vector<std::int64_t> shape;  // () for a scalar
  std::size_t data_offset = 0;      // where the values start in the file

  [[nodiscard]] std::int64_t elements() const;
};

// Parses the bytes at the start of a .npy file (at least the whole header). `file` names it in messages.
NpyHeader parse_npy_header(std::string_view bytes, const std::string& file);

// Reads and parses the header of a .npy file and checks that the file holds exactly the values the header announces.
NpyHeader read_npy_header(const std::string& file);

}  // namespace hpctrain
