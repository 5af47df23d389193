// The data tools' library side: .npy headers (good, Fortran order, malformed), .npy and CSV conversion round trips,
// the CSV errors (ragged row, non-numeric cell), the random split, and the streaming per-channel statistics.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/half.hpp"
#include "hpctrain/data/channel_statistics.hpp"
#include "hpctrain/data/convert.hpp"
#include "hpctrain/data/hdf5_dataset.hpp"
#include "hpctrain/data/npy.hpp"

namespace hpctrain {
namespace {

namespace fs = std::filesystem;

// A version 1.0 .npy file image: magic, version, header length, the dict padded to a multiple of 64 bytes, data.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
  std::string header = dict;
  const std::size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += static_cast<char>(major);
  bytes += '\0';
  const std::size_t length = header.size();
  bytes += static_cast<char>(length & 0xff);
  bytes += static_cast<char>((length >> 8) & 0xff);
  if (major > 1) bytes += std::string(2, '\0');
  return bytes + header + data;
}

std::string dict_for(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shape + ", }";
}

template <class T>
std::string raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

std::string message_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const InputError& error) {
    return error.what();
  }
  return "(no error)";
}

#define EXPECT_MESSAGE(action, part)                                              \
  do {                                                                            \
    const std::string message_ = message_of([&] { action; });                     \
    EXPECT_NE(message_.find(part), std::string::npos) << "message: " << message_; \
  } while (false)

class ConvertTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    directory_ =
        fs::temp_directory_path() / ("hpctrain-convert-" + std::string(info->name()) + "-" +
                                     std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
    fs::create_directories(directory_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(directory_, ignored);
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string file = (directory_ / name).string();
    std::ofstream(file, std::ios::binary) << bytes;
    return file;
  }
  std::string path(const std::string& name) const { return (directory_ / name).string(); }
  fs::path directory_;
};

TEST(NpyHeader, ParsesWhatNumpyWrites) {
  const NpyHeader header = parse_npy_header(npy_bytes(dict_for("<f4", "(3, 4)"), ""), "a.npy");
  EXPECT_EQ(header.type_name, "float32");
  EXPECT_EQ(header.value_bytes, 4u);
  EXPECT_EQ(header.shape, (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(header.data_offset % 64, 0u);
  EXPECT_EQ(parse_npy_header(npy_bytes(dict_for("|u1", "(5,)"), ""), "a").shape, (std::vector<std::int64_t>{5}));
  EXPECT_EQ(parse_npy_header(npy_bytes(dict_for("<i8", "()"), ""), "a").shape.size(), 0u);
  const NpyHeader v2 = parse_npy_header(npy_bytes(dict_for("<f2", "(2, 3, 4)"), "", 2), "a");
  EXPECT_EQ(v2.type_name, "float16");
  EXPECT_EQ(v2.data_offset % 64, 0u);
  for (const std::string descr : {"<f8", "<i4", "<i8", "|u1", "<i2", "<f2", "|i1", "<u2"})
    EXPECT_NO_THROW(parse_npy_header(npy_bytes(dict_for(descr, "(1, 1)"), ""), "a")) << descr;
  // Keys in another order, double quotes, Python 2 longs.
  EXPECT_EQ(
      parse_npy_header(npy_bytes("{\"shape\": (2L, 7L), \"fortran_order\": False, \"descr\": \"<f8\"}", ""), "a").shape,
      (std::vector<std::int64_t>{2, 7}));
}

TEST(NpyHeader, RejectsFortranOrderAndBadHeaders) {
  EXPECT_MESSAGE(parse_npy_header(npy_bytes(dict_for("<f4", "(3, 4)", true), ""), "f.npy"),
                 "'f.npy' stores its array in Fortran (column-major) order");
  EXPECT_MESSAGE(parse_npy_header("PK\x03\x04 not npy at all", "z.npy"), "'z.npy' is not a .npy file");
  EXPECT_MESSAGE(parse_npy_header(npy_bytes("{'descr': '<f4', 'shape': (3,)}", ""), "m.npy"),
                 "bad header (no 'fortran_order'");
  EXPECT_MESSAGE(parse_npy_header(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3, x)}", ""), "b.npy"),
                 "'b.npy' is not a valid .npy file: bad header");
  EXPECT_MESSAGE(parse_npy_header(npy_bytes("not a dict", ""), "b.npy"), "bad header (expected '{'");
  EXPECT_MESSAGE(parse_npy_header(npy_bytes(dict_for(">f4", "(3,)"), ""), "e.npy"), "'>f4' (big-endian)");
  EXPECT_MESSAGE(parse_npy_header(npy_bytes(dict_for("<U8", "(3,)"), ""), "s.npy"), "'<U8', which hpctrain does not");
  EXPECT_MESSAGE(
      parse_npy_header(npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,)}", ""), "r.npy"),
      "structured array");
  EXPECT_MESSAGE(parse_npy_header(npy_bytes(dict_for("<f4", "(3,)"), "").substr(0, 30), "t.npy"), "truncated");
}

TEST_F(ConvertTest, NpyRoundTripKeepsTypesAndValues) {
  // features (6, 2, 3) uint8, labels (6,) int64 -> /features uint8 (6, 2, 3), /labels int32
  std::vector<std::uint8_t> pixels(36);
  std::iota(pixels.begin(), pixels.end(), 200);  // wraps: 200..255, 0..
  const std::vector<std::int64_t> labels = {0, 1, 2, 1, 0, 9};
  const std::string features = write("x.npy", npy_bytes(dict_for("|u1", "(6, 2, 3)"), raw(pixels)));
  const std::string label_file = write("y.npy", npy_bytes(dict_for("<i8", "(6,)"), raw(labels)));
  const std::string output = path("out.h5");
  const std::string summary = convert_npy({features, label_file, true, true}, output);
  EXPECT_NE(summary.find("/features (6, 2, 3) uint8, /labels (6) int32, gzip level 4 + shuffle"), std::string::npos)
      << summary;
  Hdf5Dataset stored(output, "/features");
  EXPECT_EQ(stored.type_name(), "uint8");
  EXPECT_EQ(stored.shape(), (std::vector<std::int64_t>{6, 2, 3}));
  std::vector<float> values(36);
  stored.read_range(0, 6, values.data());
  for (std::size_t i = 0; i < 36; ++i) EXPECT_EQ(values[i], static_cast<float>(pixels[i])) << i;
  Hdf5Dataset stored_labels(output, "/labels");
  EXPECT_EQ(stored_labels.type_name(), "int32");
  std::vector<std::int32_t> read_labels(6);
  stored_labels.read_range(0, 6, read_labels.data());
  EXPECT_EQ(std::vector<std::int64_t>(read_labels.begin(), read_labels.end()), labels);
  {
    const auto lock = lock_hdf5();
    const H5Handle file = open_file_read_only(output);
    const H5Handle dataset = open_dataset(file.get(), "/features");
    EXPECT_EQ(storage_description(dataset.get()), "chunks (6, 2, 3), shuffle, gzip level 4");
  }

  // float16 features and float64 targets (N, K)
  std::vector<std::uint16_t> halves;
  for (const float value : {0.5f, -2.0f, 1024.0f, 3.25f}) halves.push_back(to_fp16(value).bits);
  const std::vector<double> targets = {1.5, -2.5, 1e-3, 7.0};
  const std::string output2 = path("out2.h5");
  convert_npy({write("h.npy", npy_bytes(dict_for("<f2", "(2, 2)"), raw(halves))),
               write("t.npy", npy_bytes(dict_for("<f8", "(2, 2)"), raw(targets))), false, false},
              output2);
  Hdf5Dataset half_features(output2, "/features");
  EXPECT_EQ(half_features.type_name(), "float16");
  std::vector<float> half_values(4);
  half_features.read_range(0, 2, half_values.data());
  EXPECT_EQ(half_values, (std::vector<float>{0.5f, -2.0f, 1024.0f, 3.25f}));
  Hdf5Dataset stored_targets(output2, "/targets");
  EXPECT_EQ(stored_targets.shape(), (std::vector<std::int64_t>{2, 2}));
  std::vector<float> target_values(4);
  stored_targets.read_range(0, 2, target_values.data());
  EXPECT_EQ(target_values, (std::vector<float>{1.5f, -2.5f, 1e-3f, 7.0f}));
}

TEST_F(ConvertTest, NpyConversionErrors) {
  const std::string features = write("x.npy", npy_bytes(dict_for("<f4", "(2, 2)"), raw(std::vector<float>(4))));
  const std::string flat = write("flat.npy", npy_bytes(dict_for("<f4", "(4,)"), raw(std::vector<float>(4))));
  const std::string three = write("y3.npy", npy_bytes(dict_for("<i4", "(3,)"), raw(std::vector<std::int32_t>(3))));
  const std::string fractional = write("yf.npy", npy_bytes(dict_for("<f4", "(2,)"), raw(std::vector<float>{1, 0.5})));
  const std::string short_file = write("short.npy", npy_bytes(dict_for("<f4", "(2, 2)"), raw(std::vector<float>(3))));
  EXPECT_MESSAGE(convert_npy({flat, three, true}, path("o.h5")), "features need one row per sample");
  EXPECT_MESSAGE(convert_npy({features, three, true}, path("o.h5")), "but --features has 2 samples");
  EXPECT_MESSAGE(convert_npy({features, fractional, true}, path("o.h5")), "label 0.5 of sample 1 is not a class");
  EXPECT_MESSAGE(convert_npy({short_file, three, true}, path("o.h5")), "should hold");
}

TEST_F(ConvertTest, CsvRoundTripAndErrors) {
  const std::string csv = write("a.csv",
                                "height, species ,width\r\n"
                                "1.5,2,3\n"
                                "\n"
                                "-4e-1,0,\"6\"\n"
                                "7,1,8.25\n");
  const std::string output = path("csv.h5");
  const std::string summary = convert_csv({csv, "species", true, false, false}, output);
  EXPECT_NE(summary.find("/features (3, 2) float32, /labels (3) int32 from column 2 ('species')"), std::string::npos)
      << summary;
  Hdf5Dataset features(output, "/features");
  std::vector<float> values(6);
  features.read_range(0, 3, values.data());
  EXPECT_EQ(values, (std::vector<float>{1.5f, 3, -0.4f, 6, 7, 8.25f}));
  Hdf5Dataset labels(output, "/labels");
  std::vector<std::int32_t> label_values(3);
  labels.read_range(0, 3, label_values.data());
  EXPECT_EQ(label_values, (std::vector<std::int32_t>{2, 0, 1}));
  // By index from the end, as a regression target.
  convert_csv({csv, "-1", true, true, false}, path("csv2.h5"));
  Hdf5Dataset targets(path("csv2.h5"), "/targets");
  EXPECT_EQ(targets.shape(), (std::vector<std::int64_t>{3, 1}));

  const std::string ragged = write("r.csv", "1,2,3\n4,5,6\n\n7,8\n");
  EXPECT_MESSAGE(convert_csv({ragged, "0"}, path("o.h5")), "'" + ragged + "' line 4 has 2 columns, but line 1 has 3");
  const std::string text = write("t.csv", "a,b\n1,2\n3,x7\n");
  EXPECT_MESSAGE(convert_csv({text, "a", true}, path("o.h5")), "line 3, column 2 ('b'): 'x7' is not a number");
  EXPECT_MESSAGE(convert_csv({text, "0", false}, path("o.h5")), "line 1, column 1: 'a' is not a number");
  EXPECT_MESSAGE(convert_csv({text, "c", true}, path("o.h5")), "no column named 'c' (the header has: a, b)");
  const std::string fraction = write("f.csv", "1,2.5\n");
  EXPECT_MESSAGE(convert_csv({fraction, "1"}, path("o.h5")), "label '2.5' is not a class number");
}

TEST_F(ConvertTest, SplitIsRandomDeterministicAndComplete) {
  const std::int64_t n = 50;
  std::vector<float> x(static_cast<std::size_t>(n * 3));
  std::vector<std::int64_t> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    for (int j = 0; j < 3; ++j) x[i * 3 + j] = static_cast<float>(i * 3 + j);
    y[i] = i;
  }
  const std::string input = path("all.h5");
  convert_npy({write("x.npy", npy_bytes(dict_for("<f4", "(50, 3)"), raw(x))),
               write("y.npy", npy_bytes(dict_for("<i8", "(50,)"), raw(y))), true, false},
              input);
  auto labels_of = [](const std::string& file) {
    Hdf5Dataset labels(file, "/labels");
    std::vector<std::int32_t> values(static_cast<std::size_t>(labels.samples()));
    labels.read_range(0, labels.samples(), values.data());
    return values;
  };
  const std::string summary = split_dataset({input, 0.2, 7}, path("a.h5"), path("b.h5"));
  EXPECT_NE(summary.find("40 to"), std::string::npos) << summary;
  const auto train = labels_of(path("a.h5")), validation = labels_of(path("b.h5"));
  ASSERT_EQ(train.size(), 40u);
  ASSERT_EQ(validation.size(), 10u);
  std::set<std::int32_t> all(train.begin(), train.end());
  all.insert(validation.begin(), validation.end());
  EXPECT_EQ(all.size(), 50u) << "train and validation overlap or lose samples";
  EXPECT_TRUE(std::is_sorted(train.begin(), train.end()));
  // The features moved with their labels.
  Hdf5Dataset features(path("b.h5"), "/features");
  std::vector<float> values(30);
  features.read_range(0, 10, values.data());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(values[i * 3 + 2], static_cast<float>(validation[i] * 3 + 2));
  // Same seed, same split; another seed, another split; --shuffle keeps the set but not the order.
  split_dataset({input, 0.2, 7, true}, path("c.h5"), path("d.h5"));
  auto shuffled = labels_of(path("d.h5"));
  EXPECT_NE(shuffled, validation);
  std::sort(shuffled.begin(), shuffled.end());
  EXPECT_EQ(shuffled, validation);
  split_dataset({input, 0.2, 8}, path("e.h5"), path("f.h5"));
  EXPECT_NE(labels_of(path("f.h5")), validation);
  EXPECT_MESSAGE(split_dataset({input, 1.5, 7}, path("g.h5"), path("h.h5")), "between 0 and 1");
  EXPECT_MESSAGE(split_dataset({input, 0.001, 7}, path("g.h5"), path("h.h5")), "leaves no validation samples");
}

TEST_F(ConvertTest, ChannelStatisticsMatchADirectComputation) {
  // (N, C, H, W) = (37, 3, 4, 5) with an offset that would ruin a naive sum of squares in float.
  const std::int64_t n = 37, c = 3, inner = 20;
  std::vector<double> values(static_cast<std::size_t>(n * c * inner));
  std::mt19937 generator(3);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (std::int64_t s = 0; s < n; ++s)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t k = 0; k < inner; ++k)
        values[(s * c + ch) * inner + k] = 1e6 * (ch + 1) + (ch + 1) * normal(generator);
  values[5] = std::nan("");  // sample 0, channel 0
  const std::string file = path("stats.h5");
  {
    const auto lock = lock_hdf5();
    H5Handle handle = create_file(file);
    DatasetWriter writer(handle.get(), "/features", H5T_IEEE_F64LE, {3, 4, 5}, n, false);
    writer.append(values.data(), H5T_NATIVE_DOUBLE, n);
    writer.close();
    handle.close();
  }
  Hdf5Dataset dataset(file, "/features");
  for (const std::int64_t block_values : {60, 1000, 1 << 20}) {  // one sample per block, several, all at once
    const auto statistics = channel_statistics(dataset, block_values);
    ASSERT_EQ(statistics.size(), 3u);
    for (std::int64_t ch = 0; ch < c; ++ch) {
      std::vector<double> mine;
      for (std::int64_t s = 0; s < n; ++s)
        for (std::int64_t k = 0; k < inner; ++k) {
          const double v = values[(s * c + ch) * inner + k];
          if (std::isfinite(v)) mine.push_back(v);
        }
      const double mean = std::accumulate(mine.begin(), mine.end(), 0.0) / static_cast<double>(mine.size());
      double deviations = 0;
      for (const double v : mine) deviations += (v - mean) * (v - mean);
      const ChannelStatistics& s = statistics[ch];
      EXPECT_EQ(s.count, static_cast<std::int64_t>(mine.size()));
      EXPECT_EQ(s.non_finite, ch == 0 ? 1 : 0);
      EXPECT_EQ(s.minimum, *std::min_element(mine.begin(), mine.end()));
      EXPECT_EQ(s.maximum, *std::max_element(mine.begin(), mine.end()));
      EXPECT_NEAR(s.mean, mean, 1e-9 * std::abs(mean)) << "block " << block_values << " channel " << ch;
      EXPECT_NEAR(s.standard_deviation(), std::sqrt(deviations / static_cast<double>(mine.size())), 1e-9 * (ch + 1))
          << "block " << block_values << " channel " << ch;
    }
  }
}

}  // namespace
}  // namespace hpctrain
