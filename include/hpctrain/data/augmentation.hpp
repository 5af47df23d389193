// Random augmentation of image and volume samples for training (data.augment_flip, data.augment_crop_padding,
// data.augment_rot90): flips of every spatial axis, a crop of the original extent from the sample padded on every side,
// and a rotation by a multiple of 90 degrees in the plane of the last two axes.
//
// The random choices of a sample are a pure function of (run seed, epoch, global sample index), drawn with the
// counter-based Philox generator, so an augmented batch is the same on any rank count, with or without prefetch, and
// after a resume. The BatchLoader applies it to the training split only, in its reader thread, to the rows the deck's
// transforms have already been applied to; the padding holds, per channel, the value a raw zero becomes after those
// transforms, which is what padding the raw sample with zeros would give.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hpctrain {

struct RunConfig;

// What one sample gets. Spatial axes are counted after the channel: (H, W) for images, (D, H, W) for volumes.
struct AugmentationDraw {
  std::array<bool, 3> flip{};            // per spatial axis: reverse it
  std::array<std::int64_t, 3> offset{};  // per spatial axis: the crop's origin in the padded sample, in [0, 2 P]
  int quarter_turns = 0;                 // 0..3: numpy.rot90(x, quarter_turns, axes=(-2, -1))
  friend bool operator==(const AugmentationDraw&, const AugmentationDraw&) = default;
};

class SampleAugmentation {
 public:
  // sample_shape: (C, H, W) or (C, D, H, W); padding_values: (C) the value padded positions hold per channel. The
  // shape must allow what is asked (asserted: from_deck() checks the deck against the data with messages).
  SampleAugmentation(const std::vector<std::int64_t>& sample_shape, bool flip, std::int64_t crop_padding, bool rot90,
                     std::vector<float> padding_values);

  // The deck's augmentation for training data of this per-sample shape; nullopt when no augmentation key is set.
  // Throws InputError naming the key (file:line:col) for feature vectors, a padding not below the smallest spatial
  // extent, or rot90 on samples whose last two axes differ. data_description names the data in those messages.
  static std::optional<SampleAugmentation> from_deck(const RunConfig& config,
                                                     const std::vector<std::int64_t>& sample_shape,
                                                     const std::string& data_description,
                                                     std::vector<float> padding_values);

  // The choices for one sample: Philox keyed by (seed, epoch, global sample index).
  [[nodiscard]] AugmentationDraw draw(std::uint64_t seed, std::int64_t epoch, std::int64_t sample) const;
  // out = rot90(flip(crop(pad(in)))) with the choices of `draw`; in and out are (sample size) values and must not
  // overlap.
  void apply(const AugmentationDraw& draw, const float* in, float* out) const;

  [[nodiscard]] std::int64_t sample_size() const { return channels_ * extent_[0] * extent_[1] * extent_[2]; }
  [[nodiscard]] std::string description() const;  // "flips, crops with padding 4, 90-degree rotations"

 private:
  std::int64_t channels_ = 1;
  int spatial_axes_ = 2;
  std::array<std::int64_t, 3> extent_{1, 1, 1};  // (D, H, W); D = 1 for images
  bool flip_ = false, rot90_ = false;
  std::int64_t padding_ = 0;
  std::vector<float> padding_values_;  // (channels)
};

}  // namespace hpctrain
