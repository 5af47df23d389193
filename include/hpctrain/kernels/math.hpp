// The arithmetic of the kernels, written once for every backend: per-element functions (activations and their
// derivatives, dropout's keep decision, the AdamW and SGD updates of one parameter, the loss-scaler update, the clip
// coefficient) and per-row functions (softmax cross-entropy, mean squared error, layer normalisation).
//
// Every function is HPCTRAIN_HD, so the CUDA backend's kernels are thin loops over threads around the very functions
// the CPU backend runs and the CPU tests check against double-precision references and finite differences. Functions
// are templated on the compute type C (float, or double in gradient checks) or on the storage type T (float, bf16,
// fp16, double; arithmetic in compute_t<T>).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "hpctrain/core/half.hpp"
#include "hpctrain/core/host_device.hpp"
#include "hpctrain/core/rng.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::kernel_math {

// ---- elementary functions, overloaded on the compute type ----
// The global C functions (expf, exp, ...) exist both for the host compiler and in CUDA device code; std:: overloads do
// not all exist on the device.
HPCTRAIN_HD float exponential(float x) { return ::expf(x); }
HPCTRAIN_HD double exponential(double x) { return ::exp(x); }
HPCTRAIN_HD float natural_log(float x) { return ::logf(x); }
HPCTRAIN_HD double natural_log(double x) { return ::log(x); }
HPCTRAIN_HD float square_root(float x) { return ::sqrtf(x); }
HPCTRAIN_HD double square_root(double x) { return ::sqrt(x); }
// tanh in float without a branch or a library call, so that the CPU's element-wise loops vectorise (GELU's tanh form
// in every GPT block took 20-30% of a GPT-2 124M CPU step and ~60% of gpt-tiny's while each element called libm's
// scalar tanhf; docs/performance.md). Within 1.5 ulp of the exact value (glibc's tanhf: ~2 ulp), odd, tanh(+-inf) =
// +-1, NaN stays NaN (kernel_math_test checks it against double). Results differ from tanhf's in the last bit for ~10%
// of inputs, so runs with gelu(tanh) layers are not bit-identical to those of builds before 2026-12-05.
// |x| < 0.55: x + x^3 P(x^2), P a degree-5 least-squares fit of (tanh x - x) / x^3 (relative error 8e-11);
// above: 1 - 2 / (e^{2|x|} + 1) with e^y = 2^n e^r, |r| <= ln2 / 2, e^r a degree-6 fit (6e-9), and |x| capped at 10
// (where the result rounds to 1). The threshold keeps the result >= 0.5, so the subtraction loses nothing.
HPCTRAIN_HD float fast_tanh(float x) {
  const float a = ::fabsf(x);  // NaN stays NaN
  const float s = a * a;
  float p = 0.0024036866763094897f;
  p = p * s - 0.008418804233420708f;
  p = p * s + 0.021783613866813656f;
  p = p * s - 0.05395962127414261f;
  p = p * s + 0.13333292251609796f;
  p = p * s - 0.33333332651191755f;
  const float small = a + a * s * p;
  const float y = 2.0f * (a < 10.0f ? a : 10.0f);
  const float n = ::rintf(y * 1.4426950408889634f);                           // y / ln 2, to the nearest integer: 0..29
  const float r = (y - n * 0.693145751953125f) - n * 1.428606765330187e-06f;  // ln 2 in two parts: r exact-ish
  float e = 0.001394460477015066f;
  e = e * r + 0.008371914990686605f;
  e = e * r + 0.04166628028095643f;
  e = e * r + 0.16666455845784864f;
  e = e * r + 0.5000000084422449f;
  e = e * r + 1.0000000281502266f;
  e = e * r + 0.9999999999718194f;
  const float exp_y = e * bits_float(static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23);
  const float large = 1.0f - 2.0f / (exp_y + 1.0f);
  const float t = a >= 0.55f ? large : small;
  return ::copysignf(t, x);
}
HPCTRAIN_HD double fast_tanh(double x) { return ::tanh(x); }
// The tanh layer keeps libm's tanh, so that decks with tanh layers (cosmoflow.toml's output) give the results of
// earlier builds bit for bit; GELU's tanh form (new with the transformers) takes fast_tanh.
HPCTRAIN_HD float hyperbolic_tangent(float x) { return ::tanhf(x); }
HPCTRAIN_HD double hyperbolic_tangent(double x) { return ::tanh(x); }
HPCTRAIN_HD float error_function(float x) { return ::erff(x); }
HPCTRAIN_HD double error_function(double x) { return ::erf(x); }

// Finite test on the bits: independent of -ffast-math and of which isfinite overloads a compiler provides.
HPCTRAIN_HD bool is_finite(float x) { return (float_bits(x) & 0x7f800000u) != 0x7f800000u; }
HPCTRAIN_HD bool is_finite(double x) {
#if defined(__CUDA_ARCH__)
  const auto bits = static_cast<std::uint64_t>(__double_as_longlong(x));
#else
  std::uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
#endif
  return (bits & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}

// ---- activations: value and derivative with respect to the input x ----
// relu passes NaN through (like PyTorch), so a blown-up forward still shows as a non-finite loss.
template <class C>
HPCTRAIN_HD C relu(C x) {
  return x < C(0) ? C(0) : x;
}
// 0 at x == 0, as PyTorch (gradient * (output > 0)).
template <class C>
HPCTRAIN_HD C relu_derivative(C x) {
  return x > C(0) ? C(1) : C(0);
}

// Exact GELU, PyTorch's default nn.GELU(): x * Phi(x) with Phi the standard normal CDF.
template <class C>
HPCTRAIN_HD C gelu(C x) {
  const C inv_sqrt2 = C(0.70710678118654752440);
  return C(0.5) * x * (C(1) + error_function(x * inv_sqrt2));
}
// d/dx x Phi(x) = Phi(x) + x phi(x), phi the standard normal density.
template <class C>
HPCTRAIN_HD C gelu_derivative(C x) {
  const C inv_sqrt2 = C(0.70710678118654752440);
  const C inv_sqrt_2pi = C(0.39894228040143267794);
  const C cdf = C(0.5) * (C(1) + error_function(x * inv_sqrt2));
  const C density = inv_sqrt_2pi * exponential(C(-0.5) * x * x);
  return cdf + x * density;
}

// GELU's tanh approximation, PyTorch's nn.GELU(approximate="tanh") (GPT-2's): x/2 (1 + tanh(u)) with
// u = sqrt(2/pi) (x + 0.044715 x^3).
template <class C>
HPCTRAIN_HD C gelu_tanh(C x) {
  const C sqrt_2_over_pi = C(0.79788456080286535588);
  const C t = fast_tanh(sqrt_2_over_pi * (x + C(0.044715) * x * x * x));
  return C(0.5) * x * (C(1) + t);
}
// (1 + t)/2 + x/2 (1 - t^2) du/dx with du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
template <class C>
HPCTRAIN_HD C gelu_tanh_derivative(C x) {
  const C sqrt_2_over_pi = C(0.79788456080286535588);
  const C x2 = x * x;
  const C t = fast_tanh(sqrt_2_over_pi * x * (C(1) + C(0.044715) * x2));
  const C du = sqrt_2_over_pi * (C(1) + C(3 * 0.044715) * x2);
  return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * du;
}

template <class C>
HPCTRAIN_HD C tanh_activation(C x) {
  return hyperbolic_tangent(x);
}
// The backward gets the forward input, not the output, so tanh is recomputed.
template <class C>
HPCTRAIN_HD C tanh_derivative(C x) {
  const C t = hyperbolic_tangent(x);
  return C(1) - t * t;
}

// alpha: slope for x <= 0 (PyTorch's negative_slope).
template <class C>
HPCTRAIN_HD C leaky_relu(C x, C alpha) {
  return x > C(0) ? x : alpha * x;
}
template <class C>
HPCTRAIN_HD C leaky_relu_derivative(C x, C alpha) {
  return x > C(0) ? C(1) : alpha;
}

// By kind. Kernels prefer to switch once outside their loop and call the functions above directly.
template <class C>
HPCTRAIN_HD C activation_value(Activation kind, C alpha, C x) {
  switch (kind) {
    case Activation::relu:
      return relu(x);
    case Activation::gelu:
      return gelu(x);
    case Activation::gelu_tanh:
      return gelu_tanh(x);
    case Activation::tanh:
      return tanh_activation(x);
    case Activation::leaky_relu:
      return leaky_relu(x, alpha);
  }
  return x;
}
template <class C>
HPCTRAIN_HD C activation_derivative(Activation kind, C alpha, C x) {
  switch (kind) {
    case Activation::relu:
      return relu_derivative(x);
    case Activation::gelu:
      return gelu_derivative(x);
    case Activation::gelu_tanh:
      return gelu_tanh_derivative(x);
    case Activation::tanh:
      return tanh_derivative(x);
    case Activation::leaky_relu:
      return leaky_relu_derivative(x, alpha);
  }
  return C(1);
}

// ---- integer division by a divisor fixed for a whole launch ----
// Index arithmetic of the CUDA kernels (pooling, groupnorm, bias broadcast) divides 32-bit indices by extents that are
// the same for every thread: a multiply-high and a shift instead of a hardware-less integer division (Granlund and
// Montgomery's round-up method, as PyTorch's IntDivider). Exact for every numerator below 2^31 and divisor >= 1; the
// host builds it, both compilers evaluate it, and the CPU tests check it against `/` and `%`.
struct FastDivisor {
  std::uint32_t divisor = 1, multiplier = 1, shift = 0;
  FastDivisor() = default;
  explicit FastDivisor(std::uint32_t d) : divisor(d) {
    while (shift < 32 && (std::uint64_t{1} << shift) < d) ++shift;
    multiplier = static_cast<std::uint32_t>(((std::uint64_t{1} << 32) * ((std::uint64_t{1} << shift) - d)) / d + 1);
  }
  // n / divisor for 0 <= n < 2^31.
  [[nodiscard]] HPCTRAIN_HD std::uint32_t quotient(std::uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const std::uint32_t high = __umulhi(n, multiplier);
#else
    const auto high = static_cast<std::uint32_t>((static_cast<std::uint64_t>(n) * multiplier) >> 32);
#endif
    return (high + n) >> shift;
  }
  [[nodiscard]] HPCTRAIN_HD std::uint32_t remainder(std::uint32_t n, std::uint32_t q) const { return n - q * divisor; }
};

// ---- dropout ----
// Philox has a 64-bit key and a 128-bit counter. The element index (64 bits), the layer and the purpose fill the
// counter, so the step goes into the key: dropout_key derives a key from (seed, step) with one Philox call, done once
// per kernel launch rather than per element.
HPCTRAIN_HD std::uint64_t dropout_key(std::uint64_t seed, std::uint32_t step) {
  const Philox4 derived = philox4x32(step, 0u, 0u, static_cast<std::uint32_t>(RngPurpose::dropout), seed);
  return (static_cast<std::uint64_t>(derived.v[1]) << 32) | derived.v[0];
}

// One Philox call yields four numbers, so four consecutive elements share a counter (element_index / 4) and each takes
// its lane: kernels that walk consecutive elements (the CPU loop) make one call per four elements, and every element's
// number is still a pure function of its global index.
HPCTRAIN_HD Philox4 dropout_group_bits(std::uint64_t key, std::uint32_t layer, std::uint64_t group) {
  return philox4x32(static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32), layer,
                    static_cast<std::uint32_t>(RngPurpose::dropout), key);
}

// The lane of element_index in its group's bits; a select chain, not v[lane], which would put the array in local
// memory on the GPU.
HPCTRAIN_HD std::uint32_t dropout_lane_bits(const Philox4& bits, std::uint64_t element_index) {
  const unsigned lane = static_cast<unsigned>(element_index & 3u);
  return lane == 0 ? bits.v[0] : lane == 1 ? bits.v[1] : lane == 2 ? bits.v[2] : bits.v[3];
}

// Uniform in [0, 1) for one element.
HPCTRAIN_HD float dropout_uniform(std::uint64_t key, std::uint32_t layer, std::uint64_t element_index) {
  return uniform_from_bits(dropout_lane_bits(dropout_group_bits(key, layer, element_index >> 2), element_index));
}

// Keep decision with a key from dropout_key; p is the drop probability.
HPCTRAIN_HD bool dropout_keep_with_key(std::uint64_t key, std::uint32_t layer, std::uint64_t element_index, float p) {
  return dropout_uniform(key, layer, element_index) >= p;
}

// Keep decision for element `element_index` (global: sample_id * cols + col) of dropout layer `layer` at `step`.
HPCTRAIN_HD bool dropout_keep(std::uint64_t seed, std::uint32_t step, std::uint32_t layer, std::uint64_t element_index,
                              float p) {
  return dropout_keep_with_key(dropout_key(seed, step), layer, element_index, p);
}

// Factor applied to kept elements (inverted dropout); dropped elements are multiplied by 0, so a NaN input stays NaN as
// in PyTorch. p >= 1 drops everything.
template <class C>
HPCTRAIN_HD C dropout_scale(float p) {
  return p < 1.0f ? C(1) / (C(1) - C(p)) : C(0);
}

// ---- attention dropout (Backend::attention_forward/backward, AttentionDropout) ----
// The contract every attention kernel keeps (CPU, CUDA, and any new kernel), so that all drop the same elements:
// - key = dropout_key(seed, step): one Philox call per launch (or per thread), shared with the dropout layers;
// - element (query i, key j) of head h of sequence b has the global index
//   attention_dropout_index(sample_ids[b], heads, h, sequence, i, j) = ((sample * heads + h) * T + i) * T + j, which
//   depends on the sample's global index and the model's T, never on the batch row, tile or thread;
// - four consecutive indices share one Philox call: counter (index / 4 low word, index / 4 high word, layer,
//   RngPurpose::attention_dropout) under the key, lane index % 4 of the result (dropout_lane_bits), its top 24 bits a
//   uniform u in [0, 1) (uniform_from_bits);
// - kept when u >= p; a kept probability is multiplied by dropout_scale<float>(p) = 1 / (1 - p) (fp32, or f64 for f64
//   storage), a dropped one by 0. The softmax's statistics (running maximum, sum, lse) are those of the undropped P.
// - Backward (D_i = rowsum(dO_i O_i) of the dropped output): dV += P'^T dO with P' = P * factor, and
//   dS = P (dP' * factor - D) with dP' = dO V^T, factor = keep / (1 - p) of the same element.
HPCTRAIN_HD std::uint64_t attention_dropout_index(std::int64_t sample, std::int64_t heads, std::int64_t head,
                                                  std::int64_t sequence, std::int64_t query, std::int64_t key) {
  return ((static_cast<std::uint64_t>(sample) * static_cast<std::uint64_t>(heads) + static_cast<std::uint64_t>(head)) *
              static_cast<std::uint64_t>(sequence) +
          static_cast<std::uint64_t>(query)) *
             static_cast<std::uint64_t>(sequence) +
         static_cast<std::uint64_t>(key);
}

HPCTRAIN_HD Philox4 attention_dropout_group_bits(std::uint64_t key, std::uint32_t layer, std::uint64_t group) {
  return philox4x32(static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32), layer,
                    static_cast<std::uint32_t>(RngPurpose::attention_dropout), key);
}

// Keep decision of one element from its group's bits (kernels that walk consecutive keys make one call per four).
HPCTRAIN_HD bool attention_dropout_keep_from_bits(const Philox4& group_bits, std::uint64_t index, float p) {
  return uniform_from_bits(dropout_lane_bits(group_bits, index)) >= p;
}

HPCTRAIN_HD bool attention_dropout_keep(std::uint64_t key, std::uint32_t layer, std::uint64_t index, float p) {
  return attention_dropout_keep_from_bits(attention_dropout_group_bits(key, layer, index >> 2), index, p);
}

// ---- optimizers: the update of one parameter ----
// Per-step constants of AdamW, computed once per launch. The bias corrections are computed in double: 1 - beta2^t in
// fp32 loses most of its digits for small t.
template <class C>
struct AdamWConstants {
  C learning_rate;
  C lr_weight_decay;  // lr * weight_decay (0 where weight decay does not apply)
  C beta1, one_minus_beta1;
  C beta2, one_minus_beta2;
  C eps;
  C bias_correction1;  // 1 - beta1^t
  C bias_correction2;  // 1 - beta2^t
};

// step: t = applied_steps + 1 (1 on the first update).
template <class C>
HPCTRAIN_HD AdamWConstants<C> adamw_constants(C learning_rate, C beta1, C beta2, C eps, C weight_decay,
                                              std::int32_t step) {
  AdamWConstants<C> k;
  k.learning_rate = learning_rate;
  k.lr_weight_decay = learning_rate * weight_decay;
  k.beta1 = beta1;
  k.one_minus_beta1 = C(1) - beta1;
  k.beta2 = beta2;
  k.one_minus_beta2 = C(1) - beta2;
  k.eps = eps;
  k.bias_correction1 = static_cast<C>(1.0 - ::pow(static_cast<double>(beta1), static_cast<double>(step)));
  k.bias_correction2 = static_cast<C>(1.0 - ::pow(static_cast<double>(beta2), static_cast<double>(step)));
  return k;
}

// PyTorch AdamW: decoupled weight decay first, then the moments, then the bias-corrected step.
template <class C>
HPCTRAIN_HD void adamw_update(C& parameter, C& first_moment, C& second_moment, C gradient, const AdamWConstants<C>& k) {
  parameter -= k.lr_weight_decay * parameter;
  first_moment = k.beta1 * first_moment + k.one_minus_beta1 * gradient;
  second_moment = k.beta2 * second_moment + k.one_minus_beta2 * gradient * gradient;
  const C first_hat = first_moment / k.bias_correction1;
  const C second_hat = second_moment / k.bias_correction2;
  parameter -= k.learning_rate * first_hat / (square_root(second_hat) + k.eps);
}

// PyTorch SGD (dampening 0): L2 weight decay added to the gradient; the momentum buffer starts as the first gradient
// (first_step: no update applied yet, i.e. applied_steps == 0); Nesterov looks ahead along the buffer.
// momentum_buffer is neither read nor written when momentum == 0.
template <class C>
HPCTRAIN_HD void sgd_update(C& parameter, C& momentum_buffer, C gradient, C learning_rate, C momentum, C weight_decay,
                            bool nesterov, bool first_step) {
  C direction = gradient;
  if (weight_decay != C(0)) direction += weight_decay * parameter;
  if (momentum != C(0)) {
    momentum_buffer = first_step ? direction : momentum * momentum_buffer + direction;
    direction = nesterov ? direction + momentum * momentum_buffer : momentum_buffer;
  }
  parameter -= learning_rate * direction;
}

// PyTorch clip_grad_norm_: min(1, max_norm / (norm + 1e-6)); 1 without clipping (max_norm <= 0) and when the norm is
// not finite (the step is skipped anyway).
template <class C>
HPCTRAIN_HD C clip_coefficient(C grad_norm, C max_norm) {
  if (!(max_norm > C(0))) return C(1);
  const C coefficient = max_norm / (grad_norm + C(1e-6));
  return coefficient < C(1) ? coefficient : C(1);
}

// ---- loss scaler (PyTorch GradScaler's _amp_update_scale_) ----
// After a skipped step (non-finite gradients) the scale backs off and the growth tracker restarts; after
// growth_interval finite steps in a row the scale grows, unless that would overflow. With scaling disabled or static
// the scale and tracker stay as they are; applied_steps and consecutive_skips are counted in every mode (bias
// correction, divergence detection).
HPCTRAIN_HD void update_loss_scale(const LossScalerConfig& config, StepScalars& scalars) {
  const bool dynamic = config.enabled && config.dynamic;
  if (scalars.found_nonfinite) {
    scalars.consecutive_skips += 1;
    if (dynamic) {
      scalars.loss_scale *= config.backoff_factor;
      scalars.growth_tracker = 0;
    }
    return;
  }
  scalars.applied_steps += 1;
  scalars.consecutive_skips = 0;
  if (!dynamic) return;
  const std::int32_t successful = scalars.growth_tracker + 1;
  if (successful >= config.growth_interval) {
    const float grown = scalars.loss_scale * config.growth_factor;
    if (is_finite(grown)) scalars.loss_scale = grown;
    scalars.growth_tracker = 0;
  } else {
    scalars.growth_tracker = successful;
  }
}

// ---- rows ----
// The first index of a row's maximum (ties -> the lowest index); *max_value = the maximum.
template <class T>
HPCTRAIN_HD std::int64_t row_argmax(const T* row, std::int64_t cols, compute_t<T>* max_value) {
  using C = compute_t<T>;
  C largest = load(row[0]);
  std::int64_t argmax = 0;
  for (std::int64_t j = 1; j < cols; ++j) {
    const C value = load(row[j]);
    if (value > largest) {  // strict: ties keep the lowest index
      largest = value;
      argmax = j;
    }
  }
  *max_value = largest;
  return argmax;
}

// Softmax cross-entropy of one row (cols logits, integer label), numerically stable by subtracting the row maximum.
// loss = -log softmax(x)[label]; correct: the first index of the maximum (ties -> lowest index) equals the label.
// If dlogits is not null: dlogits = (softmax(x) - onehot(label)) * grad_scale; it may alias logits (every element is
// read before it is written).
// Labels equal to this are not scored (PyTorch's ignore_index; Loss::ignore_index).
inline constexpr std::int32_t ignored_label = -100;

template <class T>
HPCTRAIN_HD void softmax_cross_entropy_row(const T* logits, std::int64_t cols, std::int32_t label,
                                           compute_t<T> grad_scale, T* dlogits, compute_t<T>* loss, bool* correct) {
  using C = compute_t<T>;
  if (label == ignored_label) {  // a target not scored: no loss, a zero gradient
    *loss = C(0);
    *correct = false;
    if (dlogits != nullptr)
      for (std::int64_t j = 0; j < cols; ++j) dlogits[j] = store<T>(C(0));
    return;
  }
  C max_value{};
  const std::int64_t argmax = row_argmax(logits, cols, &max_value);
  C sum = C(0);
  for (std::int64_t j = 0; j < cols; ++j) sum += exponential(load(logits[j]) - max_value);
  const C log_sum = natural_log(sum);
  *loss = log_sum - (load(logits[label]) - max_value);
  *correct = argmax == label;
  if (dlogits == nullptr) return;
  const C inverse_sum = C(1) / sum;
  for (std::int64_t j = 0; j < cols; ++j) {
    C probability = exponential(load(logits[j]) - max_value) * inverse_sum;
    if (j == label) probability -= C(1);
    dlogits[j] = store<T>(probability * grad_scale);
  }
}

// Cross-entropy with class weights and label smoothing (PyTorch's CrossEntropyLoss(weight=w, label_smoothing=eps)),
// per row with label y over C classes, in terms of the row's shifted logits z = x - max(x) and L = log sum_k exp(z_k):
//   loss = (1 - eps) w[y] (L - z_y) + (eps / C) sum_k w[k] (L - z_k)
//        = (1 - eps) w[y] (L - z_y) + (eps / C) (W L - sum_k w[k] z_k),   W = sum_k w[k].
// The mean over a batch divides by sum_i w[y_i] (the caller's). weighted_logit_sum: sum_k w[k] z_k.
template <class C>
HPCTRAIN_HD C smoothed_cross_entropy_loss(C log_sum, C label_logit, C label_weight, C weighted_logit_sum,
                                          C class_weight_sum, C smoothing, std::int64_t cols) {
  const C spread = smoothing / static_cast<C>(cols);
  return (C(1) - smoothing) * label_weight * (log_sum - label_logit) +
         spread * (class_weight_sum * log_sum - weighted_logit_sum);
}

// Its derivative with respect to logit j (softmax probability p_j, class weight w[j]):
//   p_j ((1 - eps) w[y] + (eps / C) W) - (1 - eps) w[y] [j == y] - (eps / C) w[j].
template <class C>
HPCTRAIN_HD C smoothed_cross_entropy_gradient(C probability, bool is_label, C class_weight, C label_weight,
                                              C class_weight_sum, C smoothing, std::int64_t cols) {
  const C spread = smoothing / static_cast<C>(cols);
  const C kept = (C(1) - smoothing) * label_weight;
  C gradient = probability * (kept + spread * class_weight_sum) - spread * class_weight;
  if (is_label) gradient -= kept;
  return gradient;
}

// The whole row (CPU backend): class_weights (cols) or null for weight 1; the other arguments as in
// softmax_cross_entropy_row, whose loss this equals (up to rounding) with no weights and no smoothing.
template <class T>
HPCTRAIN_HD void smoothed_softmax_cross_entropy_row(const T* logits, std::int64_t cols, std::int32_t label,
                                                    const float* class_weights, compute_t<T> smoothing,
                                                    compute_t<T> grad_scale, T* dlogits, compute_t<T>* loss,
                                                    bool* correct) {
  using C = compute_t<T>;
  const auto weight = [class_weights](std::int64_t j) {
    return class_weights != nullptr ? static_cast<C>(class_weights[j]) : C(1);
  };
  C max_value{};
  const std::int64_t argmax = row_argmax(logits, cols, &max_value);
  C sum = C(0), weighted_logit_sum = C(0), class_weight_sum = C(0);
  for (std::int64_t j = 0; j < cols; ++j) {
    const C shifted = load(logits[j]) - max_value;
    sum += exponential(shifted);
    weighted_logit_sum += weight(j) * shifted;
    class_weight_sum += weight(j);
  }
  const C label_weight = weight(label);
  *loss = smoothed_cross_entropy_loss(natural_log(sum), load(logits[label]) - max_value, label_weight,
                                      weighted_logit_sum, class_weight_sum, smoothing, cols);
  *correct = argmax == label;
  if (dlogits == nullptr) return;
  const C inverse_sum = C(1) / sum;
  for (std::int64_t j = 0; j < cols; ++j) {
    const C probability = exponential(load(logits[j]) - max_value) * inverse_sum;
    dlogits[j] = store<T>(smoothed_cross_entropy_gradient(probability, j == label, weight(j), label_weight,
                                                          class_weight_sum, smoothing, cols) *
                          grad_scale);
  }
}

// Mean squared error of one row: returns mean_j (pred - target)^2; if dpred is not null, dpred = 2 (pred - target) /
// cols * grad_scale (may alias pred). target is in the master dtype, which is the compute type.
template <class T>
HPCTRAIN_HD compute_t<T> mean_squared_error_row(const T* pred, const compute_t<T>* target, std::int64_t cols,
                                                compute_t<T> grad_scale, T* dpred) {
  using C = compute_t<T>;
  const C gradient_factor = C(2) * grad_scale / static_cast<C>(cols);
  C sum = C(0);
  for (std::int64_t j = 0; j < cols; ++j) {
    const C difference = load(pred[j]) - target[j];
    sum += difference * difference;
    if (dpred != nullptr) dpred[j] = store<T>(difference * gradient_factor);
  }
  return sum / static_cast<C>(cols);
}

// Layer normalisation of one row (PyTorch: biased variance, eps inside the square root), two passes for accuracy.
// y = (x - mean) * rstd * gamma + beta; gamma/beta null mean 1/0. mean and rstd are returned for the backward.
// y may alias x.
template <class T>
HPCTRAIN_HD void layernorm_forward_row(const T* x, std::int64_t cols, const compute_t<T>* gamma,
                                       const compute_t<T>* beta, compute_t<T> eps, T* y, compute_t<T>* mean_out,
                                       compute_t<T>* rstd_out) {
  using C = compute_t<T>;
  C sum = C(0);
  for (std::int64_t j = 0; j < cols; ++j) sum += load(x[j]);
  const C mean = sum / static_cast<C>(cols);
  C squares = C(0);
  for (std::int64_t j = 0; j < cols; ++j) {
    const C centred = load(x[j]) - mean;
    squares += centred * centred;
  }
  const C rstd = C(1) / square_root(squares / static_cast<C>(cols) + eps);
  for (std::int64_t j = 0; j < cols; ++j) {
    const C normalised = (load(x[j]) - mean) * rstd;
    const C scaled = gamma != nullptr ? normalised * gamma[j] : normalised;
    y[j] = store<T>(beta != nullptr ? scaled + beta[j] : scaled);
  }
  *mean_out = mean;
  *rstd_out = rstd;
}

// Input gradient of layer normalisation for one row: with xhat = (x - mean) rstd and g = dy * gamma,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). dx may alias dy. (dgamma, dbeta are column sums over rows, done by
// the kernel.)
template <class T>
HPCTRAIN_HD void layernorm_backward_row(const T* x, const T* dy, std::int64_t cols, const compute_t<T>* gamma,
                                        compute_t<T> mean, compute_t<T> rstd, T* dx) {
  using C = compute_t<T>;
  C sum_g = C(0), sum_g_xhat = C(0);
  for (std::int64_t j = 0; j < cols; ++j) {
    const C xhat = (load(x[j]) - mean) * rstd;
    const C g = gamma != nullptr ? load(dy[j]) * gamma[j] : load(dy[j]);
    sum_g += g;
    sum_g_xhat += g * xhat;
  }
  const C mean_g = sum_g / static_cast<C>(cols);
  const C mean_g_xhat = sum_g_xhat / static_cast<C>(cols);
  for (std::int64_t j = 0; j < cols; ++j) {
    const C xhat = (load(x[j]) - mean) * rstd;
    const C g = gamma != nullptr ? load(dy[j]) * gamma[j] : load(dy[j]);
    dx[j] = store<T>(rstd * (g - mean_g - xhat * mean_g_xhat));
  }
}

}  // namespace hpctrain::kernel_math
