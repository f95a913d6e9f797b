// The whole batch-1 decode step of a tinyllm.model.Transformer on the CPU, as one C++ call
// (tinyllm/cpu_step.py builds it with cpu_qgemv.cpp and holds it for a decoder).
//
// Contract: torch.classes.tinyllm_cpu.Step(tensors, config, eps) holds the model's tensors (no
// copy) and `forward(tok, pos, first_valid, window) -> logits` runs one decode step:
//   tensors  [tok_emb w, s, z | norm | lm_head w, s, z | rope cos, sin (L, Dh/2) fp32], then
//            for each layer [attn_norm | wqkv w, s, z | wo w, s, z | ffn_norm | w13 w, s, z |
//            w2 w, s, z | k cache, v cache (1, Hkv, rows, Dh) fp32]; a matrix's s and z are
//            empty tensors where it has none (cpu_matrix.h, Matrix::of, says which forms).
//   config   [n_layers, dim, n_heads, n_kv_heads, ffn_dim]
//   tok (1, 1) int64, pos (1,) int64 and first_valid (1,) int64: the StaticKVCache's own
//   tensors. The step embeds tok, runs every block (RMSNorm, the fused QKV product, RoPE in
//   the rotate-half layout at pos, K/V written at pos, attention over keys first_valid..pos,
//   the output product and the residual, RMSNorm, SwiGLU and the residual), the final norm
//   and lm_head, adds 1 to pos, and returns fresh logits (1, 1, V) fp32.
//   `forward_greedy(tok, pos, first_valid, window, ring, ring_at, penalty, n_valid)`: forward,
//   then the StepSampler's greedy push and draw (its ring, ring_at and penalty tensors) into tok;
//   `forward_sample(..., n_valid, temperature, top_k, top_p, key, counter)` the sampled one
//   (draw_sorted's result with noise_at's noise; the counter advances).
// That is model.Transformer.forward through a StaticKVCache's decode view, with the same
// kernels for every product (cpu_qgemv), so it matches the eager step up to fp32 rounding of
// the norms, RoPE and sums. Refuses (c10::Error, a RuntimeError in Python): a token outside the
// embedding, pos outside the window or the cache.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_matrix.h"

namespace {

using tinyllm_cpu::Matrix;

struct Layer {
  at::Tensor attn_norm, ffn_norm, k, v;
  Matrix wqkv, wo, w13, w2;
};

// y = x / sqrt(mean(x^2) + eps) * weight, x and y (n) fp32 (model.RMSNorm).
void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* y) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * weight[i];
}

// Rotate-half RoPE of `heads` heads of d dims in place: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s).
void rope(float* x, int64_t heads, int64_t d, const float* cos, const float* sin) {
  const int64_t h2 = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* p = x + h * d;
    for (int64_t j = 0; j < h2; ++j) {
      const float a = p[j], b = p[j + h2];
      p[j] = a * cos[j] - b * sin[j];
      p[j + h2] = b * cos[j] + a * sin[j];
    }
  }
}

template <class T>
float widen(T v) { return static_cast<float>(v); }

// tinyllm.step_sampler's 32-bit hash (_mix) and Exponential(1) noise of id j (noise_at, batch 1).
constexpr uint64_t M32 = 0xFFFFFFFFull;
inline uint64_t mix(uint64_t x) {
  x ^= x >> 16;
  x = (x * 0x7FEB352Dull) & M32;
  x ^= x >> 15;
  x = (x * 0x2C1B3C6Dull) & M32;
  return x ^ (x >> 16);
}
inline float noise(uint64_t salt, uint64_t key1, int64_t j) {
  const uint64_t h = mix(mix(static_cast<uint64_t>(j) ^ salt) ^ key1);
  const float u = (static_cast<float>(h >> 8) + 0.5f) * (1.0f / (1 << 24));
  return -std::log(u);
}

// The sampled draw of tinyllm.step_sampler.draw_sorted for one row x (V, penalized, ids past
// n_valid -inf): x / temperature; top-k keeps values >= the k-th largest; top-p keeps the
// largest values while the softmax mass before each is below top_p (mass summed in double, as
// torch.cumsum does on a CPU); then argmax(softmax(x) / noise). Only the values top-k and
// top-p keep are sorted (a partial sort that grows until the mass is reached), and noise is
// computed only for them. x is scratch.
int64_t draw_sampled(std::vector<float>& x, float temperature, int64_t top_k, float top_p, uint64_t salt,
                     uint64_t key1, std::vector<int32_t>& cand) {
  const int64_t V = static_cast<int64_t>(x.size());
  for (float& v : x) v /= temperature;
  cand.clear();
  for (int64_t j = 0; j < V; ++j)
    if (x[j] != -INFINITY) cand.push_back(static_cast<int32_t>(j));
  if (cand.empty()) return 0;
  auto desc = [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  if (top_k > 0 && top_k < V) {  // the k-th largest of all V values (-inf ones included)
    float kth = -INFINITY;
    if (static_cast<int64_t>(cand.size()) >= top_k) {
      std::nth_element(cand.begin(), cand.begin() + (top_k - 1), cand.end(), desc);
      kth = x[cand[top_k - 1]];
    }
    cand.erase(std::remove_if(cand.begin(), cand.end(), [&](int32_t j) { return x[j] < kth; }), cand.end());
  }
  if (top_p < 1.f) {
    float m = -INFINITY;
    for (int32_t j : cand) m = std::max(m, x[j]);
    float z = 0.f;
    for (int32_t j : cand) z += std::exp(x[j] - m);
    size_t sorted = 0, want = std::min<size_t>(64, cand.size());
    double mass = 0.0;
    for (size_t i = 0;; ++i) {
      if (i == sorted) {  // sort the next stretch of the largest values
        want = std::min(cand.size(), std::max(want, 2 * sorted));
        std::partial_sort(cand.begin() + sorted, cand.begin() + want, cand.end(), desc);
        sorted = want;
      }
      if (i == cand.size()) break;
      const float p = std::exp(x[cand[i]] - m) / z;
      if (static_cast<float>(mass + p) - p >= top_p) {  // this value and every smaller one go
        cand.resize(i);
        break;
      }
      mass += p;
    }
  }
  float m = -INFINITY;
  for (int32_t j : cand) m = std::max(m, x[j]);
  float z = 0.f;
  for (int32_t j : cand) z += std::exp(x[j] - m);
  int64_t best = cand[0];
  float best_v = -1.f;
  for (int32_t j : cand) {
    const float v = std::exp(x[j] - m) / z / noise(salt, key1, j);
    if (v > best_v || (v == best_v && j < best)) best = j, best_v = v;
  }
  return best;
}

class Step : public torch::CustomClassHolder {
 public:
  Step(std::vector<at::Tensor> t, std::vector<int64_t> config, double eps) : eps_(static_cast<float>(eps)) {
    TORCH_CHECK(config.size() == 5, "config: [n_layers, dim, n_heads, n_kv_heads, ffn_dim]");
    L_ = config[0], C_ = config[1], H_ = config[2], Hkv_ = config[3], F_ = config[4];
    TORCH_CHECK(H_ % Hkv_ == 0 && C_ % H_ == 0, "heads must divide");
    Dh_ = C_ / H_;
    TORCH_CHECK(static_cast<int64_t>(t.size()) == 9 + 16 * L_, "expected ", 9 + 16 * L_, " tensors, got ", t.size());
    auto opt = [](const at::Tensor& x) { return x.numel() ? x : at::Tensor(); };
    emb_w_ = t[0], emb_s_ = opt(t[1]), emb_z_ = opt(t[2]);
    norm_ = fp32_vector(t[3], C_, "norm");
    out_ = Matrix::of(t[4], opt(t[5]), opt(t[6]));
    cos_ = t[7], sin_ = t[8];
    TORCH_CHECK(cos_.scalar_type() == at::kFloat && cos_.is_contiguous() && cos_.dim() == 2 &&
                cos_.size(1) == Dh_ / 2 && sin_.sizes() == cos_.sizes() && sin_.is_contiguous(),
                "rope tables must be contiguous fp32 (L, head_dim / 2)");
    check_embedding();
    TORCH_CHECK(out_.K == C_, "lm_head must take dim inputs");
    V_ = out_.N;
    for (int64_t i = 0; i < L_; ++i) {
      const at::Tensor* p = t.data() + 9 + 16 * i;
      Layer l{fp32_vector(p[0], C_, "attn_norm"), fp32_vector(p[7], C_, "ffn_norm"), p[14], p[15],
              Matrix::of(p[1], opt(p[2]), opt(p[3])), Matrix::of(p[4], opt(p[5]), opt(p[6])),
              Matrix::of(p[8], opt(p[9]), opt(p[10])), Matrix::of(p[11], opt(p[12]), opt(p[13]))};
      TORCH_CHECK(l.wqkv.N == (H_ + 2 * Hkv_) * Dh_ && l.wqkv.K == C_ && l.wo.N == C_ && l.wo.K == H_ * Dh_ &&
                  l.w13.N == 2 * F_ && l.w13.K == C_ && l.w2.N == C_ && l.w2.K == F_, "layer ", i, ": matrix shapes");
      TORCH_CHECK(l.k.dim() == 4 && l.k.size(0) == 1 && l.k.size(1) == Hkv_ && l.k.size(3) == Dh_ &&
                  l.k.scalar_type() == at::kFloat && l.v.sizes() == l.k.sizes() && l.v.scalar_type() == at::kFloat,
                  "layer ", i, ": the cache must be fp32 (1, n_kv_heads, rows, head_dim)");
      layers_.push_back(std::move(l));
    }
    rows_ = layers_.empty() ? 0 : layers_[0].k.size(2);
    x_.resize(C_), h_.resize(C_), o_.resize(C_);
    qkv_.resize((H_ + 2 * Hkv_) * Dh_), att_.resize(H_ * Dh_);
  }

  at::Tensor forward(const at::Tensor& tok, const at::Tensor& pos, const at::Tensor& first_valid, int64_t window) {
    TORCH_CHECK(tok.numel() == 1 && tok.scalar_type() == at::kLong && pos.numel() == 1 &&
                pos.scalar_type() == at::kLong && first_valid.numel() == 1 && first_valid.scalar_type() == at::kLong,
                "tok, pos and first_valid: one int64 each (batch 1)");
    const int64_t id = tok.data_ptr<int64_t>()[0];
    int64_t& p = pos.data_ptr<int64_t>()[0];
    const int64_t first = first_valid.data_ptr<int64_t>()[0];
    TORCH_CHECK(0 <= id && id < emb_w_.size(0), "token id ", id, " is outside the embedding (", emb_w_.size(0), ")");
    TORCH_CHECK(0 <= p && p < window && p < rows_ && p < cos_.size(0), "position ", p, " is outside the window ",
                window, " or the cache");
    embed(id, x_.data());
    const float *cs = cos_.data_ptr<float>() + p * (Dh_ / 2), *sn = sin_.data_ptr<float>() + p * (Dh_ / 2);
    const float scale = 1.f / std::sqrt(static_cast<float>(Dh_));
    const int64_t R = H_ / Hkv_;
    for (const Layer& l : layers_) {
      rms_norm(x_.data(), l.attn_norm.data_ptr<float>(), C_, eps_, h_.data());
      tinyllm_cpu::matvec(l.wqkv, h_.data(), qkv_.data());  // (H + 2 Hkv) Dh: q, k, v
      float *q = qkv_.data(), *k = q + H_ * Dh_, *v = k + Hkv_ * Dh_;
      rope(q, H_, Dh_, cs, sn);
      rope(k, Hkv_, Dh_, cs, sn);
      float *kc = l.k.data_ptr<float>(), *vc = l.v.data_ptr<float>();
      for (int64_t h = 0; h < Hkv_; ++h) {  // the cache at (0, h, p, :)
        std::copy(k + h * Dh_, k + (h + 1) * Dh_, kc + h * l.k.stride(1) + p * l.k.stride(2));
        std::copy(v + h * Dh_, v + (h + 1) * Dh_, vc + h * l.v.stride(1) + p * l.v.stride(2));
      }
      tinyllm_cpu::attend(q, R, l.k, l.v, first, p, scale, att_.data());  // (Hkv, R, Dh)
      tinyllm_cpu::matvec(l.wo, att_.data(), o_.data());
      for (int64_t i = 0; i < C_; ++i) x_[i] += o_[i];
      rms_norm(x_.data(), l.ffn_norm.data_ptr<float>(), C_, eps_, h_.data());
      tinyllm_cpu::ffn(l.w13, l.w2, h_.data(), o_.data());
      for (int64_t i = 0; i < C_; ++i) x_[i] += o_[i];
    }
    rms_norm(x_.data(), norm_.data_ptr<float>(), C_, eps_, h_.data());
    at::Tensor logits = at::empty({1, 1, V_}, tok.options().dtype(at::kFloat));
    tinyllm_cpu::matvec(out_, h_.data(), logits.data_ptr<float>());
    ++p;
    return logits;
  }

  // forward(), then tinyllm.step_sampler's greedy push and draw: ring[ring_at] = tok, ring_at
  // advances (mod the ring's length), and tok = the argmax over ids below n_valid of the logits
  // with the repetition penalty applied at the ring's ids (positive logits divided by it,
  // negative ones multiplied); the first of equal maxima, as torch.argmax picks.
  at::Tensor forward_greedy(const at::Tensor& tok, const at::Tensor& pos, const at::Tensor& first_valid,
                            int64_t window, const at::Tensor& ring, const at::Tensor& ring_at,
                            const at::Tensor& penalty, int64_t n_valid) {
    at::Tensor logits = forward(tok, pos, first_valid, window);
    push_and_penalize(logits, tok, ring, ring_at, penalty, n_valid);
    int64_t best = 0;
    for (int64_t j = 1; j < V_; ++j)
      if (pen_[j] > pen_[best] || (std::isnan(pen_[j]) && !std::isnan(pen_[best]))) best = j;
    tok.data_ptr<int64_t>()[0] = best;
    return logits;
  }

  // forward(), then the sampled push and draw (step_sampler.draw_sorted with the noise of
  // draw `counter` of seed `key`; counter advances): settings are the StepSampler's tensors.
  at::Tensor forward_sample(const at::Tensor& tok, const at::Tensor& pos, const at::Tensor& first_valid,
                            int64_t window, const at::Tensor& ring, const at::Tensor& ring_at,
                            const at::Tensor& penalty, int64_t n_valid, const at::Tensor& temperature,
                            const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& key,
                            const at::Tensor& counter) {
    TORCH_CHECK(temperature.scalar_type() == at::kFloat && top_p.scalar_type() == at::kFloat &&
                top_k.scalar_type() == at::kLong && key.scalar_type() == at::kLong && key.numel() == 2 &&
                counter.scalar_type() == at::kLong && counter.numel() == 1,
                "sample: the StepSampler's settings tensors");
    at::Tensor logits = forward(tok, pos, first_valid, window);
    push_and_penalize(logits, tok, ring, ring_at, penalty, n_valid);
    const int64_t* k = key.data_ptr<int64_t>();
    int64_t& c = counter.data_ptr<int64_t>()[0];
    const uint64_t key0 = static_cast<uint64_t>(k[0]), key1 = static_cast<uint64_t>(k[1]);
    const uint64_t salt = mix(mix(key0 ^ (static_cast<uint64_t>(c) & M32)) ^ key1);
    ++c;
    tok.data_ptr<int64_t>()[0] = draw_sampled(pen_, temperature.data_ptr<float>()[0], top_k.data_ptr<int64_t>()[0],
                                              top_p.data_ptr<float>()[0], salt, key1, cand_);
    return logits;
  }

 private:
  // ring[ring_at] = tok, ring_at advances; pen_ = logits (V) with ids from n_valid on -inf and
  // the repetition penalty at the ring's ids (sampling.apply_repeat_penalty).
  void push_and_penalize(const at::Tensor& logits, const at::Tensor& tok, const at::Tensor& ring,
                         const at::Tensor& ring_at, const at::Tensor& penalty, int64_t n_valid) {
    TORCH_CHECK(ring.scalar_type() == at::kLong && ring.dim() == 2 && ring.size(0) == 1 && ring.is_contiguous() &&
                ring_at.scalar_type() == at::kLong && ring_at.numel() == 1 && penalty.scalar_type() == at::kFloat &&
                penalty.numel() == 1 && 0 < n_valid && n_valid <= V_, "the StepSampler's tensors, batch 1");
    int64_t* rp = ring.data_ptr<int64_t>();
    const int64_t n = ring.size(1);
    int64_t& at = ring_at.data_ptr<int64_t>()[0];
    rp[at] = tok.data_ptr<int64_t>()[0];
    at = (at + 1) % n;
    const float* lp = logits.data_ptr<float>();
    const float pen = penalty.data_ptr<float>()[0];
    pen_.assign(lp, lp + V_);
    std::fill(pen_.begin() + n_valid, pen_.end(), -INFINITY);
    for (int64_t i = 0; i < n; ++i) {
      if (rp[i] < 0 || rp[i] >= n_valid) continue;  // ids past n_valid stay -inf
      const float v = lp[rp[i]];
      pen_[rp[i]] = v > 0 ? v / pen : v * pen;
    }
  }

  static at::Tensor fp32_vector(const at::Tensor& t, int64_t n, const char* what) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == n, what, " must be fp32 (", n, ")");
    return t;
  }

  void check_embedding() {
    const auto dt = emb_w_.scalar_type();
    TORCH_CHECK(emb_w_.dim() == 2 && emb_w_.is_contiguous(), "tok_emb must be a contiguous (V, C) table");
    if (dt == at::kChar) {
      TORCH_CHECK(emb_w_.size(1) == C_ && emb_s_.defined() && emb_s_.numel() == emb_w_.size(0) &&
                  emb_s_.is_contiguous() && (emb_s_.scalar_type() == at::kFloat || emb_s_.scalar_type() == at::kHalf) &&
                  !emb_z_.defined(), "tok_emb: int8 rows need fp32 or fp16 scales (V,)");
    } else if (dt == at::kByte) {
      auto f32_or_f16 = [](const at::Tensor& t) { return t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf; };
      TORCH_CHECK(2 * emb_w_.size(1) == C_ && emb_s_.defined() && emb_z_.defined() && emb_s_.dim() == 2 &&
                  emb_s_.size(0) == emb_w_.size(0) && C_ % emb_s_.size(1) == 0 && emb_z_.sizes() == emb_s_.sizes() &&
                  emb_s_.is_contiguous() && emb_z_.is_contiguous() && f32_or_f16(emb_s_) && f32_or_f16(emb_z_),
                  "tok_emb: int4 rows need scales and zeros (V, C/g), each fp32 or fp16");
    } else {
      TORCH_CHECK(emb_w_.size(1) == C_ && (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf),
                  "tok_emb must be fp32, bf16, fp16, int8 or int4 rows of dim");
    }
  }

  // x = row id of the embedding, dequantized or widened (quant.QuantEmbedding, model.embed).
  void embed(int64_t id, float* x) const {
    switch (emb_w_.scalar_type()) {
      case at::kFloat: return widen_row(emb_w_.data_ptr<float>() + id * C_, x);
      case at::kBFloat16: return widen_row(emb_w_.data_ptr<at::BFloat16>() + id * C_, x);
      case at::kHalf: return widen_row(emb_w_.data_ptr<at::Half>() + id * C_, x);
      case at::kChar: {
        const int8_t* q = emb_w_.data_ptr<int8_t>() + id * C_;
        const float s = scale(emb_s_, id);
        for (int64_t i = 0; i < C_; ++i) x[i] = static_cast<float>(q[i]) * s;
        return;
      }
      default: {
        const uint8_t* q = emb_w_.data_ptr<uint8_t>() + id * (C_ / 2);
        const int64_t ng = emb_s_.size(1), g = C_ / ng;
        for (int64_t i = 0; i < C_; ++i) {
          const float qv = static_cast<float>(i % 2 ? q[i / 2] >> 4 : q[i / 2] & 15);
          const int64_t at = id * ng + i / g;
          x[i] = qv * scale(emb_s_, at) + scale(emb_z_, at);
        }
      }
    }
  }

  static float scale(const at::Tensor& t, int64_t i) {  // element i of fp32 or fp16 t
    return t.scalar_type() == at::kHalf ? widen(t.data_ptr<at::Half>()[i]) : t.data_ptr<float>()[i];
  }

  template <class T>
  void widen_row(const T* row, float* x) const {
    for (int64_t i = 0; i < C_; ++i) x[i] = widen(row[i]);
  }

  int64_t L_, C_, H_, Hkv_, F_, Dh_, V_, rows_;
  float eps_;
  at::Tensor emb_w_, emb_s_, emb_z_, norm_, cos_, sin_;
  Matrix out_;
  std::vector<Layer> layers_;
  std::vector<float> pen_;  // the penalized logits of a draw
  std::vector<int32_t> cand_;  // the ids a sampled draw still considers
  std::vector<float> x_, h_, o_, qkv_, att_;  // the residual row, a normed row, a product's row, q|k|v, attention
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(tinyllm_cpu, m) {
  m.class_<Step>("Step")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, double>())
      .def("forward", &Step::forward)
      .def("forward_greedy", &Step::forward_greedy)
      .def("forward_sample", &Step::forward_sample);
}
