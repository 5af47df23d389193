// Flips, padded crops and 90-degree rotations of image and volume samples, one gather pass per sample.
#include "hpctrain/data/augmentation.hpp"

#include <algorithm>
#include <sstream>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/rng.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

namespace {
// A uniform integer in [0, count) from 32 random bits (multiply-shift: bias below count / 2^32).
std::int64_t below(std::uint32_t bits, std::int64_t count) {
  return static_cast<std::int64_t>((static_cast<std::uint64_t>(bits) * static_cast<std::uint64_t>(count)) >> 32);
}

// A coordinate that is affine in the innermost output index w: base + step * w.
struct Affine {
  std::int64_t base = 0, step = 0;
  [[nodiscard]] std::int64_t at(std::int64_t w) const { return base + step * w; }
  // Narrow [begin, end) to the w whose coordinate lies in [0, extent) (step is -1, 0 or 1).
  void clip(std::int64_t extent, std::int64_t& begin, std::int64_t& end) const {
    if (step == 0) {
      if (base < 0 || base >= extent) end = begin;
    } else if (step > 0) {
      begin = std::max(begin, -base);
      end = std::min(end, extent - base);
    } else {
      begin = std::max(begin, base - extent + 1);
      end = std::min(end, base + 1);
    }
  }
};
}  // namespace

SampleAugmentation::SampleAugmentation(const std::vector<std::int64_t>& sample_shape, bool flip,
                                       std::int64_t crop_padding, bool rot90, std::vector<float> padding_values)
    : flip_(flip), rot90_(rot90), padding_(crop_padding), padding_values_(std::move(padding_values)) {
  HPCTRAIN_ASSERT(sample_shape.size() == 3 || sample_shape.size() == 4,
                  "augmentation of samples " << shape_text(sample_shape) << ": (C, H, W) or (C, D, H, W) expected");
  channels_ = sample_shape[0];
  spatial_axes_ = static_cast<int>(sample_shape.size()) - 1;
  std::copy(sample_shape.begin() + 1, sample_shape.end(), extent_.begin() + (3 - spatial_axes_));
  const std::int64_t smallest = *std::min_element(sample_shape.begin() + 1, sample_shape.end());
  HPCTRAIN_ASSERT(crop_padding >= 0 && crop_padding < smallest,
                  "crop padding " << crop_padding << " for samples " << shape_text(sample_shape));
  HPCTRAIN_ASSERT(!rot90 || extent_[1] == extent_[2], "rot90 of samples " << shape_text(sample_shape));
  HPCTRAIN_ASSERT(static_cast<std::int64_t>(padding_values_.size()) == channels_,
                  padding_values_.size() << " padding values for " << channels_ << " channels");
}

std::optional<SampleAugmentation> SampleAugmentation::from_deck(const RunConfig& config,
                                                                const std::vector<std::int64_t>& sample_shape,
                                                                const std::string& data_description,
                                                                std::vector<float> padding_values) {
  const DataSection& data = config.data;
  const std::int64_t padding = data.augment_crop_padding;
  if (!data.augment_flip && padding == 0 && !data.augment_rot90) return std::nullopt;
  const std::string first_key = data.augment_flip ? "data.augment_flip"
                                : padding > 0     ? "data.augment_crop_padding"
                                                  : "data.augment_rot90";
  const std::string samples = "the samples of data.train (" + data_description + ") have shape " +
                              shape_text(sample_shape) + " ('" + data.features + "' without its first dimension)";
  HPCTRAIN_VERIFY(
      sample_shape.size() == 3 || sample_shape.size() == 4, InputError,
      config.where(first_key) << ": " << first_key << " augments images (N, C, H, W) and volumes (N, C, D, H, W), but "
                              << samples,
      sample_shape.size() < 3 ? "leave the data.augment_* keys out for feature vectors, or store images "
                                "channels first as (N, C, H, W) (one channel: (N, 1, H, W))"
                              : "leave the data.augment_* keys out for samples of more than 3 spatial axes");
  const std::int64_t smallest = *std::min_element(sample_shape.begin() + 1, sample_shape.end());
  HPCTRAIN_VERIFY(padding < smallest, InputError,
                  config.where("data.augment_crop_padding")
                      << ": data.augment_crop_padding = " << padding
                      << " must be smaller than the smallest spatial extent (" << smallest << "), but " << samples,
                  "use a padding below " + std::to_string(smallest) + " (an eighth of the extent is usual: 4 for 32)");
  const std::int64_t height = sample_shape[sample_shape.size() - 2], width = sample_shape.back();
  HPCTRAIN_VERIFY(!data.augment_rot90 || height == width, InputError,
                  config.where("data.augment_rot90")
                      << ": data.augment_rot90 rotates in the plane of the last two axes, which must have the same "
                         "extent ("
                      << height << " and " << width << " here), but " << samples,
                  "leave data.augment_rot90 out, or store the samples with square last two axes");
  return SampleAugmentation(sample_shape, data.augment_flip, padding, data.augment_rot90, std::move(padding_values));
}

AugmentationDraw SampleAugmentation::draw(std::uint64_t seed, std::int64_t epoch, std::int64_t sample) const {
  const Philox4 bits = random_bits(seed, RngPurpose::augmentation, static_cast<std::uint32_t>(epoch),
                                   static_cast<std::uint64_t>(sample));
  AugmentationDraw choice;
  for (int axis = 0; axis < spatial_axes_; ++axis) {
    choice.flip[axis] = flip_ && ((bits.v[0] >> axis) & 1u) != 0;
    choice.offset[axis] = below(bits.v[1 + axis], 2 * padding_ + 1);
  }
  choice.quarter_turns = rot90_ ? static_cast<int>((bits.v[0] >> 3) & 3u) : 0;
  return choice;
}

void SampleAugmentation::apply(const AugmentationDraw& draw, const float* in, float* out) const {
  const auto [depth, height, width] = extent_;
  // The choices per axis of (D, H, W); an image's D axis is never flipped or shifted.
  const int first = 3 - spatial_axes_;
  std::array<bool, 3> flip{};
  std::array<std::int64_t, 3> shift{};  // crop: an output coordinate o reads the input at o + shift (or padding)
  for (int axis = 0; axis < spatial_axes_; ++axis) {
    flip[first + axis] = draw.flip[axis];
    shift[first + axis] = draw.offset[axis] - padding_;
  }
  const std::int64_t side = height;  // rotations only happen when height == width
  const std::int64_t plane = height * width;

  for (std::int64_t c = 0; c < channels_; ++c) {
    const float* source = in + c * depth * plane;
    const float pad = padding_values_[c];
    for (std::int64_t z = 0; z < depth; ++z) {
      float* row_out = out + (c * depth + z) * plane;
      const std::int64_t source_z = (flip[0] ? depth - 1 - z : z) + shift[0];
      if (source_z < 0 || source_z >= depth) {
        std::fill(row_out, row_out + plane, pad);
        continue;
      }
      const float* source_plane = source + source_z * plane;
      for (std::int64_t h = 0; h < height; ++h) {
        // Undo the rotation: output (h, w) of rot90^k reads the flipped crop at (row, column), affine in w
        // (numpy.rot90: k = 1 reads (w, side - 1 - h)).
        Affine row, column;
        switch (draw.quarter_turns) {
          case 0:
            row = {h, 0}, column = {0, 1};
            break;
          case 1:
            row = {0, 1}, column = {side - 1 - h, 0};
            break;
          case 2:
            row = {side - 1 - h, 0}, column = {side - 1, -1};
            break;
          default:
            row = {side - 1, -1}, column = {h, 0};
            break;
        }
        // Undo the flips, then the crop.
        if (flip[1]) row = {height - 1 - row.base, -row.step};
        if (flip[2]) column = {width - 1 - column.base, -column.step};
        row.base += shift[1];
        column.base += shift[2];
        // The outputs [begin, end) of this row read inside the sample, at a fixed stride; the others are padding.
        std::int64_t begin = 0, end = width;
        row.clip(height, begin, end);
        column.clip(width, begin, end);
        float* values = row_out + h * width;
        std::fill(values, values + std::min(begin, width), pad);
        if (begin < end) {
          const float* first = source_plane + row.at(begin) * width + column.at(begin);
          const std::int64_t stride = row.step * width + column.step, count = end - begin;
          if (stride == 1) {  // no rotation or a half turn: a row, forwards or backwards
            std::copy(first, first + count, values + begin);
          } else if (stride == -1) {
            std::reverse_copy(first - count + 1, first + 1, values + begin);
          } else {  // a quarter turn: a column
            for (std::int64_t w = 0; w < count; ++w) values[begin + w] = first[w * stride];
          }
        }
        std::fill(values + std::min(std::max(begin, end), width), values + width, pad);
      }
    }
  }
}

std::string SampleAugmentation::description() const {
  std::ostringstream text;
  const char* separator = "";
  if (flip_) {
    text << "random flips of every spatial axis";
    separator = ", ";
  }
  if (padding_ > 0) {
    text << separator << "random crops after padding by " << padding_;
    separator = ", ";
  }
  if (rot90_) text << separator << "random 90-degree rotations";
  return text.str();
}

}  // namespace hpctrain
