// Augmentation of images and volumes (data/augmentation.hpp): the one-pass gather against a naive reference that pads,
// crops, flips and rotates step by step (exact: augmentation only moves values); the draws are a pure function of
// (seed, epoch, sample), differ between epochs and cover every choice; every output value comes from the input or is
// the padding of its channel; the deck's keys are checked against the data's shape with one message naming the key
// (their ranges: run_config_errors_test).
#include "hpctrain/data/augmentation.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "hpctrain/core/error.hpp"
#include "run_config_test_support.hpp"

namespace hpctrain {
namespace {

using deck_test::deck_with;
using deck_test::parse;

// A sample as (C, D, H, W) with D = 1 for images: the naive reference works on this.
struct Volume {
  std::int64_t channels = 1, depth = 1, height = 1, width = 1;
  std::vector<float> values;
  float& at(std::int64_t c, std::int64_t z, std::int64_t y, std::int64_t x) {
    return values[static_cast<std::size_t>(((c * depth + z) * height + y) * width + x)];
  }
};

Volume volume_of(std::int64_t c, std::int64_t d, std::int64_t h, std::int64_t w) {
  return {c, d, h, w, std::vector<float>(static_cast<std::size_t>(c * d * h * w))};
}

// Step by step: pad every spatial side by p with pad[c], take the crop at `offset`, flip, rotate one quarter at a time
// (numpy.rot90 with axes (-2, -1): out[i][j] = in[j][side - 1 - i]).
Volume naive_augment(Volume in, bool volume, const AugmentationDraw& draw, std::int64_t p,
                     const std::vector<float>& pad) {
  const int first = volume ? 0 : 1;  // the draw's axis 0 is D for volumes, H for images
  std::array<bool, 3> flip{};
  std::array<std::int64_t, 3> offset{p, p, p};  // an image's D axis: the identity crop
  if (!volume) offset[0] = 0;
  for (int axis = 0; axis < (volume ? 3 : 2); ++axis) {
    flip[first + axis] = draw.flip[axis];
    offset[first + axis] = draw.offset[axis];
  }
  const std::int64_t dp = volume ? p : 0;
  Volume padded = volume_of(in.channels, in.depth + 2 * dp, in.height + 2 * p, in.width + 2 * p);
  for (std::int64_t c = 0; c < in.channels; ++c)
    for (std::int64_t z = 0; z < padded.depth; ++z)
      for (std::int64_t y = 0; y < padded.height; ++y)
        for (std::int64_t x = 0; x < padded.width; ++x) {
          const std::int64_t sz = z - dp, sy = y - p, sx = x - p;
          const bool inside = sz >= 0 && sz < in.depth && sy >= 0 && sy < in.height && sx >= 0 && sx < in.width;
          padded.at(c, z, y, x) = inside ? in.at(c, sz, sy, sx) : pad[static_cast<std::size_t>(c)];
        }
  Volume cropped = volume_of(in.channels, in.depth, in.height, in.width);
  for (std::int64_t c = 0; c < in.channels; ++c)
    for (std::int64_t z = 0; z < in.depth; ++z)
      for (std::int64_t y = 0; y < in.height; ++y)
        for (std::int64_t x = 0; x < in.width; ++x)
          cropped.at(c, z, y, x) = padded.at(c, z + offset[0], y + offset[1], x + offset[2]);
  Volume flipped = cropped;
  for (std::int64_t c = 0; c < in.channels; ++c)
    for (std::int64_t z = 0; z < in.depth; ++z)
      for (std::int64_t y = 0; y < in.height; ++y)
        for (std::int64_t x = 0; x < in.width; ++x)
          flipped.at(c, z, y, x) = cropped.at(c, flip[0] ? in.depth - 1 - z : z, flip[1] ? in.height - 1 - y : y,
                                              flip[2] ? in.width - 1 - x : x);
  Volume rotated = flipped;
  for (int turn = 0; turn < draw.quarter_turns; ++turn) {
    const Volume before = rotated;
    const std::int64_t side = in.height;
    for (std::int64_t c = 0; c < in.channels; ++c)
      for (std::int64_t z = 0; z < in.depth; ++z)
        for (std::int64_t i = 0; i < side; ++i)
          for (std::int64_t j = 0; j < side; ++j)
            rotated.at(c, z, i, j) = const_cast<Volume&>(before).at(c, z, j, side - 1 - i);
  }
  return rotated;
}

// Random values, distinct within the sample (so that where each output value came from can be told).
Volume random_volume(std::int64_t c, std::int64_t d, std::int64_t h, std::int64_t w, std::mt19937& generator) {
  Volume v = volume_of(c, d, h, w);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::set<float> seen;
  for (float& value : v.values) {
    do value = uniform(generator);
    while (!seen.insert(value).second);
  }
  return v;
}

std::vector<float> augmented(const SampleAugmentation& augmentation, const AugmentationDraw& draw, const Volume& in) {
  std::vector<float> out(in.values.size(), std::numeric_limits<float>::quiet_NaN());  // poisoned
  augmentation.apply(draw, in.values.data(), out.data());
  return out;
}

TEST(Augmentation, GatherMatchesTheNaiveReferenceForEveryChoice) {
  std::mt19937 generator(17);
  const std::vector<float> pad = {-0.75f, 3.5f};
  struct Shape {
    std::vector<std::int64_t> sample;
    bool volume;
  };
  for (const Shape& shape :
       {Shape{{2, 5, 5}, false}, Shape{{2, 4, 6}, false}, Shape{{2, 3, 5, 5}, true}, Shape{{2, 4, 3, 6}, true}}) {
    const auto& s = shape.sample;
    const bool square = s[s.size() - 2] == s.back();
    const Volume in =
        shape.volume ? random_volume(s[0], s[1], s[2], s[3], generator) : random_volume(s[0], 1, s[1], s[2], generator);
    for (const std::int64_t p : {0, 1, 2}) {
      const SampleAugmentation augmentation(s, true, p, square, pad);
      const int axes = shape.volume ? 3 : 2;
      // Every flip pattern and rotation with random offsets, plus the extreme offsets.
      for (int pattern = 0; pattern < (1 << axes); ++pattern)
        for (int turns = 0; turns < (square ? 4 : 1); ++turns)
          for (int trial = 0; trial < 3; ++trial) {
            AugmentationDraw draw;
            for (int axis = 0; axis < axes; ++axis) {
              draw.flip[axis] = ((pattern >> axis) & 1) != 0;
              draw.offset[axis] = trial == 0   ? 0
                                  : trial == 1 ? 2 * p
                                               : std::uniform_int_distribution<std::int64_t>(0, 2 * p)(generator);
            }
            draw.quarter_turns = turns;
            SCOPED_TRACE("shape " + std::to_string(s.size()) + "-d, padding " + std::to_string(p) + ", flips " +
                         std::to_string(pattern) + ", turns " + std::to_string(turns) + ", trial " +
                         std::to_string(trial));
            const Volume expected = naive_augment(in, shape.volume, draw, p, pad);
            ASSERT_EQ(augmented(augmentation, draw, in), expected.values);
          }
    }
  }
}

TEST(Augmentation, NoChoiceIsTheIdentityAndQuarterTurnsCompose) {
  std::mt19937 generator(3);
  const Volume in = random_volume(3, 1, 6, 6, generator);
  const SampleAugmentation augmentation({3, 6, 6}, true, 2, true, {0.0f, 0.0f, 0.0f});
  AugmentationDraw identity;
  identity.offset = {2, 2, 0};  // offset p: the crop of the original place
  EXPECT_EQ(augmented(augmentation, identity, in), in.values);
  // Two half turns are the identity; a half turn is the flip of both axes.
  AugmentationDraw half = identity, both_flips = identity;
  half.quarter_turns = 2;
  both_flips.flip = {true, true, false};
  Volume once = in;
  once.values = augmented(augmentation, half, in);
  EXPECT_EQ(augmented(augmentation, half, once), in.values);
  EXPECT_EQ(once.values, augmented(augmentation, both_flips, in));
}

TEST(Augmentation, EveryOutputValueIsFromItsChannelOrItsPadding) {
  std::mt19937 generator(5);
  const std::vector<float> pad = {9.0f, -9.0f, 0.5f};
  const Volume in = random_volume(3, 4, 4, 4, generator);
  const SampleAugmentation augmentation({3, 4, 4, 4}, true, 3, true, pad);
  const std::int64_t per_channel = 64;
  std::int64_t padded = 0;
  for (std::int64_t sample = 0; sample < 200; ++sample) {
    const AugmentationDraw draw = augmentation.draw(11, 2, sample);
    const std::vector<float> out = augmented(augmentation, draw, in);
    for (std::int64_t c = 0; c < 3; ++c) {
      const std::set<float> channel(in.values.begin() + c * per_channel, in.values.begin() + (c + 1) * per_channel);
      std::multiset<float> used;
      for (std::int64_t i = 0; i < per_channel; ++i) {
        const float value = out[static_cast<std::size_t>(c * per_channel + i)];
        ASSERT_FALSE(std::isnan(value)) << "sample " << sample << " channel " << c << " element " << i;
        if (value == pad[static_cast<std::size_t>(c)]) {
          ++padded;
          continue;
        }
        ASSERT_TRUE(channel.count(value)) << "sample " << sample << " channel " << c << " element " << i;
        used.insert(value);
      }
      for (const float value : used) ASSERT_EQ(used.count(value), 1u) << "an input value used twice";
    }
  }
  EXPECT_GT(padded, 0);  // padding 3 of 4: most crops reach into it
}

TEST(Augmentation, DrawsArePureAndDifferBetweenEpochsSamplesAndSeeds) {
  const SampleAugmentation augmentation({1, 8, 8, 8}, true, 2, true, {0.0f});
  std::map<std::string, int> counts;
  int same_epoch = 0, same_seed = 0;
  for (std::int64_t sample = 0; sample < 400; ++sample) {
    const AugmentationDraw draw = augmentation.draw(42, 3, sample);
    EXPECT_EQ(draw, augmentation.draw(42, 3, sample));  // a pure function of the key
    same_epoch += draw == augmentation.draw(42, 4, sample);
    same_seed += draw == augmentation.draw(43, 3, sample);
    for (int axis = 0; axis < 3; ++axis) {
      ++counts["flip" + std::to_string(axis) + "=" + std::to_string(draw.flip[axis])];
      ASSERT_GE(draw.offset[axis], 0);
      ASSERT_LE(draw.offset[axis], 4);
      ++counts["offset" + std::to_string(axis) + "=" + std::to_string(draw.offset[axis])];
    }
    ++counts["turns=" + std::to_string(draw.quarter_turns)];
  }
  // 2 x 5^3 x 2^3 x 4 = 4000 possible draws: a few coincidences at most.
  EXPECT_LT(same_epoch, 10);
  EXPECT_LT(same_seed, 10);
  // Every choice occurs, each roughly as often as it should (p = 1/2, 1/5, 1/4 of 400 draws).
  for (int axis = 0; axis < 3; ++axis) {
    for (int flip = 0; flip < 2; ++flip)
      EXPECT_GT(counts["flip" + std::to_string(axis) + "=" + std::to_string(flip)], 150);
    for (int offset = 0; offset <= 4; ++offset)
      EXPECT_GT(counts["offset" + std::to_string(axis) + "=" + std::to_string(offset)], 50);
  }
  for (int turns = 0; turns < 4; ++turns) EXPECT_GT(counts["turns=" + std::to_string(turns)], 60);
  // What is not asked for is never drawn.
  const SampleAugmentation crop_only({1, 8, 8}, false, 1, false, {0.0f});
  for (std::int64_t sample = 0; sample < 100; ++sample) {
    const AugmentationDraw draw = crop_only.draw(42, 0, sample);
    EXPECT_EQ(draw.flip, (std::array<bool, 3>{}));
    EXPECT_EQ(draw.quarter_turns, 0);
    EXPECT_EQ(draw.offset[2], 0);  // images have two spatial axes
  }
  const SampleAugmentation flip_only({1, 8, 8}, true, 0, false, {0.0f});
  EXPECT_EQ(flip_only.draw(1, 0, 0).offset, (std::array<std::int64_t, 3>{}));
}

TEST(Augmentation, DeckKeysAreCheckedAgainstTheSampleShape) {
  const auto check = [](const std::string& key, const std::string& value, const std::vector<std::int64_t>& shape) {
    const RunConfig config = parse(deck_with(key, value));
    return SampleAugmentation::from_deck(config, shape, "train.h5",
                                         std::vector<float>(static_cast<std::size_t>(shape[0]), 0.0f));
  };
  EXPECT_FALSE(check("data.augment_flip", "false", {784}).has_value());  // nothing asked: nothing checked
  EXPECT_TRUE(check("data.augment_flip", "true", {3, 32, 32}).has_value());
  EXPECT_TRUE(check("data.augment_rot90", "true", {2, 8, 16, 16}).has_value());
  EXPECT_TRUE(check("data.augment_crop_padding", "3", {1, 4, 9, 9}).has_value());
  struct Case {
    std::string key, value;
    std::vector<std::int64_t> shape;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"data.augment_flip",
       "true",
       {784},
       "decks/test.toml:2:1: data.augment_flip augments images (N, C, H, W) and volumes (N, C, D, H, W), but the "
       "samples of data.train (train.h5) have shape (784)"},
      {"data.augment_crop_padding",
       "2",
       {28, 28},
       "decks/test.toml:2:1: data.augment_crop_padding augments images (N, C, H, W)"},
      {"data.augment_rot90", "true", {1, 2, 3, 4, 5}, "data.augment_rot90 augments images"},
      {"data.augment_crop_padding",
       "4",
       {3, 8, 4},
       "decks/test.toml:2:1: data.augment_crop_padding = 4 must be smaller than the smallest spatial extent (4)"},
      {"data.augment_crop_padding", "9", {1, 9, 16, 16}, "smallest spatial extent (9)"},
      {"data.augment_rot90",
       "true",
       {3, 16, 32},
       "decks/test.toml:2:1: data.augment_rot90 rotates in the plane of the last two axes, which must have the same "
       "extent (16 and 32 here)"},
      {"data.augment_rot90", "true", {1, 16, 16, 8}, "(16 and 8 here)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key + " = " + c.value);
    try {
      check(c.key, c.value, c.shape);
      ADD_FAILURE() << "no error";
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find(c.expected), std::string::npos) << error.what();
      EXPECT_FALSE(error.hint().empty());
    }
  }
}

}  // namespace
}  // namespace hpctrain
