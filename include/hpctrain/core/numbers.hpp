// Small helpers on numbers shared by log lines, messages and summaries: one text form each, and the median; the slice
// of a count that a rank owns.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hpctrain {

// Six significant digits, as printf's "%.6g": "0.123457", "1e+06". Log lines and messages.
std::string number_text(double value);

// The shortest text that reads back as the same double: "0.1", "1e-08", "65536". Values shown to be copied.
std::string shortest_number_text(double value);

// A size in bytes for people: "512 bytes", "400.0 KiB", "1.6 MiB", "2.0 GiB".
std::string byte_size_text(std::uintmax_t bytes);

// Elements [begin, end) of a flat vector.
struct ElementRange {
  std::int64_t begin = 0, end = 0;
  [[nodiscard]] std::int64_t size() const { return end - begin; }
};

// The contiguous slice [first, second) of `count` items that `rank` of `ranks` owns: rank r starts at count * r / ranks
// (the slices differ in length by one at most). A rank's samples in local-shuffle mode; a rank's share of a bucket in
// the rank-order all-reduce. With a granule, the same split of the count's granules (the last may be partial): every
// slice is whole granules but the last rank's, so a sharded optimizer's ranks own whole chunks of the gradient norm.
std::pair<std::int64_t, std::int64_t> rank_slice(std::int64_t count, int ranks, int rank, std::int64_t granule = 1);

// The middle value, or the mean of the middle two; 0 for none. (Rates over intervals and ranks.)
double median(std::vector<double> values);

}  // namespace hpctrain
