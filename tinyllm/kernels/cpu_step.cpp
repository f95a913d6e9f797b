// The whole batch-1 decode step of a tinyllm.model.Transformer on the CPU, as one C++ call
// (tinyllm/decode/cpu_step.py builds it with cpu_qgemv.cpp and holds it for a decoder).
//
// Contract: torch.classes.tinyllm_cpu.Step(tensors, config, scalars) holds the model's tensors
// (no copy) and `forward(tok, pos, first_valid, window) -> logits` runs one decode step:
//   tensors  [tok_emb w, s, z | norm | lm_head w, s, z | rope cos, sin | local rope cos, sin],
//            the tables (L, rotary_dim / 2) fp32 (the local ones the global ones again where the
//            model has one RoPE), then for each layer [attn_norm | wqkv w, s, z | wo w, s, z |
//            ffn_norm | w13 w, s, z | w2 w, s, z | bqkv (q_dim + 2 kv_dim) | q_norm, k_norm
//            (Dh) | post_attn_norm, post_ffn_norm (dim) | k cache, v cache (1, Hkv, rows, Dh)
//            fp32, or bf16 (the compact cache: K/V rounded to nearest even as written, widened
//            as the attention reads them; q and every sum stay fp32), or int8 (the more compact
//            one) | k scales, v scales (1, Hkv, rows) fp32, int8 caches only: each head's K/V at
//            a position written as round(x / s) half to even, s = absmax / 127 (0 and s = 0 for
//            a zero head), as tinyllm.kv_cache.quantize_int8 writes it]; a matrix's s and z are
//            empty tensors where it has none (cpu_matrix.h, Matrix::of, says which forms), and so
//            is each optional vector the model lacks (and the scales of an fp32 or bf16 cache).
//   config   [n_layers, dim, n_heads, n_kv_heads, ffn_dim, head_dim, rotary_dim, gelu,
//            window of layer 0, ..., of layer n_layers - 1] (gelu 1: GeGLU, 0: SwiGLU; a
//            window > 0: a local layer, attending that many keys, itself included, with the
//            local tables)
//   scalars  [norm_eps, embed_scale, attn_scale (the query scale itself), attn_softcap,
//            final_softcap, residual_scale, logit_divisor] (a cap of 0: none)
//   tok (1, 1) int64, pos (1,) int64 and first_valid (1,) int64: the StaticKVCache's own
//   tensors. The step embeds tok (times embed_scale), runs every block (RMSNorm, the fused QKV
//   product plus its bias, each head of q and k RMS-normed, RoPE in the rotate-half layout at
//   pos over the first rotary_dim dims of each head, K/V written at pos, attention over keys
//   first_valid..pos (a local layer's from pos - window + 1), soft-capped scores, the output
//   product, its post-norm and the residual (each half's output times residual_scale), RMSNorm,
//   SwiGLU or GeGLU, its post-norm and the residual), the final norm and lm_head, the logits
//   divided by logit_divisor, the final soft-cap, adds 1 to pos, and returns
//   fresh logits (1, 1, V) fp32. That is model.Transformer.forward with every ModelConfig
//   feature tinyllm.model.native_unsupported does not name.
//   `forward_greedy(tok, pos, first_valid, window, ring, ring_at, penalty, n_valid, hist, dry,
//   dry_n, breaker)`: forward, then the StepSampler's greedy push and draw (its ring, ring_at,
//   penalty and DRY tensors) into tok; `forward_sample(..., breaker, temperature, top_k, top_p,
//   key, counter)` the sampled one
//   (sampling.draw_sorted's result with sampling.noise_at's noise; the counter advances): both
//   by the one C++ Sampler (cpu_sampler.h), which torch.classes.tinyllm_cpu.Sampler() also
//   offers alone: `greedy(logits, tok, ring, ring_at, penalty, n_valid, hist, dry, dry_n,
//   breaker)` and `sample(logits, tok, ..., breaker, temperature, top_k, top_p, key, counter)`,
//   logits (1, V) fp32.
// That is model.Transformer.forward through a StaticKVCache's decode view, with the same
// kernels for every product (cpu_qgemv), so it matches the eager step up to fp32 rounding of
// the norms, RoPE, GeGLU's and the soft-caps' tanh (tanh256: within about 1e-7) and sums.
// Refuses (c10::Error, a RuntimeError in Python): at construction, heads the decode attention
// does not take (head_dim not a multiple of 8 up to 256, more than 8 query heads a key/value
// head: model.native_unsupported names them first) and tensors of other shapes or dtypes; at a
// step, a token outside the embedding, pos outside the window or the cache.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_kernels.h"
#include "cpu_matrix.h"
#include "cpu_sampler.h"

namespace {

using tinyllm_cpu::Matrix;

struct Layer {
  at::Tensor attn_norm, ffn_norm, k, v, ks, vs;  // ks, vs: an int8 cache's scales (else undefined)
  Matrix wqkv, wo, w13, w2;
  // optional (undefined where the model has none): the q/k/v bias, the per-head q and k norms,
  // the attention's and the FFN's post-norms
  at::Tensor bqkv, q_norm, k_norm, post_attn, post_ffn;
  int64_t window;  // keys a local layer attends (itself included); 0: every key, global tables
};

// y = x / sqrt(mean(x^2) + eps) * weight, x and y (n) fp32 (model.RMSNorm).
void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* y) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * weight[i];
}

// Rotate-half RoPE in place of `heads` heads, d dims apart, over the first 2 h2 dims of each
// (the rest unchanged: partial rotary): (x1, x2) -> (x1 c - x2 s, x2 c + x1 s).
void rope(float* x, int64_t heads, int64_t d, int64_t h2, const float* cos, const float* sin) {
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

// A StepSampler's DRY tensors: hist (1, H) int64, dry (2,) fp32 (multiplier, base), dry_n (2,)
// int64 (allowed length, last-n), breaker (V,) bool.
struct Dry {
  const at::Tensor &hist, &dry, &dry_n, &breaker;
};

// The C++ Sampler (cpu_sampler.h) on a StepSampler's tensors, batch 1: tensors checked, then
// tok pushed and the draw from logits written into tok. The Step draws through it, and so does
// the registered class "Sampler" (tinyllm.decode.cpu_step.native_draw: the parity tests).
class TensorSampler {
 public:
  void greedy(const at::Tensor& logits, const at::Tensor& tok, const at::Tensor& ring, const at::Tensor& ring_at,
              const at::Tensor& penalty, int64_t n_valid, const Dry& dry) {
    push(logits, tok, ring, ring_at, penalty, n_valid, dry);
    tok.data_ptr<int64_t>()[0] = sampler_.greedy();
  }

  void sample(const at::Tensor& logits, const at::Tensor& tok, const at::Tensor& ring, const at::Tensor& ring_at,
              const at::Tensor& penalty, int64_t n_valid, const Dry& dry, const at::Tensor& temperature,
              const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& key, const at::Tensor& counter) {
    TORCH_CHECK(temperature.scalar_type() == at::kFloat && top_p.scalar_type() == at::kFloat &&
                top_k.scalar_type() == at::kLong && key.scalar_type() == at::kLong && key.numel() == 2 &&
                counter.scalar_type() == at::kLong && counter.numel() == 1,
                "sample: the StepSampler's settings tensors");
    push(logits, tok, ring, ring_at, penalty, n_valid, dry);
    const int64_t* k = key.data_ptr<int64_t>();
    tok.data_ptr<int64_t>()[0] = sampler_.sample({temperature.data_ptr<float>()[0], top_k.data_ptr<int64_t>()[0],
                                                  top_p.data_ptr<float>()[0], static_cast<uint64_t>(k[0]),
                                                  static_cast<uint64_t>(k[1]), counter.data_ptr<int64_t>()});
  }

 private:
  void push(const at::Tensor& logits, const at::Tensor& tok, const at::Tensor& ring, const at::Tensor& ring_at,
            const at::Tensor& penalty, int64_t n_valid, const Dry& dry) {
    const int64_t V = logits.size(-1);
    TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.is_contiguous() && logits.numel() == V &&
                tok.scalar_type() == at::kLong && tok.numel() == 1, "logits (1, V) fp32 and tok (1, 1) int64");
    TORCH_CHECK(ring.scalar_type() == at::kLong && ring.dim() == 2 && ring.size(0) == 1 && ring.is_contiguous() &&
                ring_at.scalar_type() == at::kLong && ring_at.numel() == 1 && penalty.scalar_type() == at::kFloat &&
                penalty.numel() == 1 && 0 < n_valid && n_valid <= V, "the StepSampler's tensors, batch 1");
    TORCH_CHECK(dry.hist.scalar_type() == at::kLong && dry.hist.dim() == 2 && dry.hist.size(0) == 1 &&
                dry.hist.is_contiguous() && dry.dry.scalar_type() == at::kFloat && dry.dry.numel() == 2 &&
                dry.dry_n.scalar_type() == at::kLong && dry.dry_n.numel() == 2 &&
                dry.breaker.scalar_type() == at::kBool && dry.breaker.is_contiguous() && dry.breaker.numel() >= n_valid,
                "the StepSampler's DRY tensors: hist (1, H) int64, dry (2,) fp32, dry_n (2,) int64, breaker (V,) bool");
    const float* d = dry.dry.data_ptr<float>();
    const int64_t* dn = dry.dry_n.data_ptr<int64_t>();
    sampler_.push_and_penalize({ring.data_ptr<int64_t>(), ring.size(1), ring_at.data_ptr<int64_t>(),
                                penalty.data_ptr<float>()[0], n_valid, dry.hist.data_ptr<int64_t>(), dry.hist.size(1),
                                d[0], d[1], dn[0], dn[1], dry.breaker.data_ptr<bool>()},
                               tok.data_ptr<int64_t>()[0], logits.data_ptr<float>(), V);
  }

  tinyllm_cpu::Sampler sampler_;
};

class SamplerClass : public torch::CustomClassHolder {
 public:
  void greedy(const at::Tensor& logits, const at::Tensor& tok, const at::Tensor& ring, const at::Tensor& ring_at,
              const at::Tensor& penalty, int64_t n_valid,
              const at::Tensor& hist, const at::Tensor& dry, const at::Tensor& dry_n, const at::Tensor& breaker) {
    s_.greedy(logits, tok, ring, ring_at, penalty, n_valid, Dry{hist, dry, dry_n, breaker});
  }
  void sample(const at::Tensor& logits, const at::Tensor& tok, const at::Tensor& ring, const at::Tensor& ring_at,
              const at::Tensor& penalty, int64_t n_valid,
              const at::Tensor& hist, const at::Tensor& dry, const at::Tensor& dry_n, const at::Tensor& breaker,
              const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& key,
              const at::Tensor& counter) {
    s_.sample(logits, tok, ring, ring_at, penalty, n_valid, Dry{hist, dry, dry_n, breaker}, temperature, top_k, top_p,
              key, counter);
  }

 private:
  TensorSampler s_;
};

class Step : public torch::CustomClassHolder {
 public:
  Step(std::vector<at::Tensor> t, std::vector<int64_t> config, std::vector<double> scalars) {
    TORCH_CHECK(config.size() >= 8 && static_cast<int64_t>(config.size()) == 8 + config[0],
                "config: [n_layers, dim, n_heads, n_kv_heads, ffn_dim, head_dim, rotary_dim, gelu, windows...]");
    TORCH_CHECK(scalars.size() == 7, "scalars: [norm_eps, embed_scale, attn_scale, attn_softcap, final_softcap, "
                "residual_scale, logit_divisor]");
    L_ = config[0], C_ = config[1], H_ = config[2], Hkv_ = config[3], F_ = config[4], Dh_ = config[5];
    rot2_ = config[6] / 2, gelu_ = config[7] != 0;
    eps_ = static_cast<float>(scalars[0]), embed_scale_ = static_cast<float>(scalars[1]);
    scale_ = static_cast<float>(scalars[2]), attn_cap_ = static_cast<float>(scalars[3]);
    final_cap_ = static_cast<float>(scalars[4]), res_scale_ = static_cast<float>(scalars[5]);
    logit_div_ = static_cast<float>(scalars[6]);
    TORCH_CHECK(logit_div_ > 0.f, "logit_divisor must be > 0");
    TORCH_CHECK(H_ > 0 && Hkv_ > 0 && H_ % Hkv_ == 0, "heads must divide");
    TORCH_CHECK(Dh_ % 8 == 0 && Dh_ <= tinyllm_cpu::ATTN_MAX_D && H_ / Hkv_ <= tinyllm_cpu::ATTN_MAX_R,
                "head_dim must be a multiple of 8 up to ", tinyllm_cpu::ATTN_MAX_D, " and n_heads / n_kv_heads at most ",
                tinyllm_cpu::ATTN_MAX_R);
    TORCH_CHECK(0 < rot2_ && 2 * rot2_ <= Dh_, "rotary_dim must be even, from 2 to head_dim");
    constexpr int64_t HEAD = 11, PER_LAYER = 23;
    TORCH_CHECK(static_cast<int64_t>(t.size()) == HEAD + PER_LAYER * L_, "expected ", HEAD + PER_LAYER * L_,
                " tensors, got ", t.size());
    auto opt = [](const at::Tensor& x) { return x.numel() ? x : at::Tensor(); };
    emb_w_ = t[0], emb_s_ = opt(t[1]), emb_z_ = opt(t[2]);
    norm_ = fp32_vector(t[3], C_, "norm");
    out_ = Matrix::of(t[4], opt(t[5]), opt(t[6]));
    cos_ = table(t[7], "rope cos"), sin_ = table(t[8], "rope sin");
    local_cos_ = table(t[9], "local rope cos"), local_sin_ = table(t[10], "local rope sin");
    TORCH_CHECK(sin_.sizes() == cos_.sizes() && local_sin_.sizes() == local_cos_.sizes(), "rope tables: cos and sin");
    check_embedding();
    TORCH_CHECK(out_.K == C_, "lm_head must take dim inputs");
    V_ = out_.N;
    const int64_t QKV = (H_ + 2 * Hkv_) * Dh_;
    for (int64_t i = 0; i < L_; ++i) {
      const at::Tensor* p = t.data() + HEAD + PER_LAYER * i;
      auto vec = [&](const at::Tensor& x, int64_t n, const char* what) {
        return x.numel() ? fp32_vector(x, n, what) : at::Tensor();
      };
      Layer l{fp32_vector(p[0], C_, "attn_norm"), fp32_vector(p[7], C_, "ffn_norm"), p[19], p[20], opt(p[21]), opt(p[22]),
              Matrix::of(p[1], opt(p[2]), opt(p[3])), Matrix::of(p[4], opt(p[5]), opt(p[6])),
              Matrix::of(p[8], opt(p[9]), opt(p[10])), Matrix::of(p[11], opt(p[12]), opt(p[13])),
              vec(p[14], QKV, "bqkv"), vec(p[15], Dh_, "q_norm"), vec(p[16], Dh_, "k_norm"),
              vec(p[17], C_, "post_attn_norm"), vec(p[18], C_, "post_ffn_norm"), config[8 + i]};
      TORCH_CHECK(l.window >= 0, "layer ", i, ": a window must be >= 0");
      TORCH_CHECK(l.q_norm.defined() == l.k_norm.defined(), "layer ", i, ": q and k norms come together");
      TORCH_CHECK(l.wqkv.N == QKV && l.wqkv.K == C_ && l.wo.N == C_ && l.wo.K == H_ * Dh_ &&
                  l.w13.N == 2 * F_ && l.w13.K == C_ && l.w2.N == C_ && l.w2.K == F_, "layer ", i, ": matrix shapes");
      const auto kv = l.k.scalar_type();
      TORCH_CHECK(l.k.dim() == 4 && l.k.size(0) == 1 && l.k.size(1) == Hkv_ && l.k.size(3) == Dh_ &&
                  (kv == at::kFloat || kv == at::kBFloat16 || kv == at::kChar) && l.v.sizes() == l.k.sizes() &&
                  l.v.scalar_type() == kv && l.k.stride(3) == 1 && l.v.stride(3) == 1,
                  "layer ", i, ": the cache must be fp32, bf16 or int8 (1, n_kv_heads, rows, head_dim)");
      auto scales = [&](const at::Tensor& s) {
        return s.defined() && s.scalar_type() == at::kFloat && s.dim() == 3 && s.size(0) == 1 &&
               s.size(1) == Hkv_ && s.size(2) == l.k.size(2) && s.stride(2) == 1;
      };
      TORCH_CHECK(kv == at::kChar ? scales(l.ks) && scales(l.vs) : !l.ks.defined() && !l.vs.defined(), "layer ", i,
                  ": an int8 cache needs fp32 scales (1, n_kv_heads, rows), another cache none");
      layers_.push_back(std::move(l));
    }
    rows_ = layers_.empty() ? 0 : layers_[0].k.size(2);
    x_.resize(C_), h_.resize(C_), o_.resize(C_);
    qkv_.resize(QKV), att_.resize(H_ * Dh_);
  }

  at::Tensor forward(const at::Tensor& tok, const at::Tensor& pos, const at::Tensor& first_valid, int64_t window) {
    TORCH_CHECK(tok.numel() == 1 && tok.scalar_type() == at::kLong && pos.numel() == 1 &&
                pos.scalar_type() == at::kLong && first_valid.numel() == 1 && first_valid.scalar_type() == at::kLong,
                "tok, pos and first_valid: one int64 each (batch 1)");
    const int64_t id = tok.data_ptr<int64_t>()[0];
    int64_t& p = pos.data_ptr<int64_t>()[0];
    const int64_t first = first_valid.data_ptr<int64_t>()[0];
    TORCH_CHECK(0 <= id && id < emb_w_.size(0), "token id ", id, " is outside the embedding (", emb_w_.size(0), ")");
    TORCH_CHECK(0 <= p && p < window && p < rows_ && p < cos_.size(0) && p < local_cos_.size(0), "position ", p,
                " is outside the window ", window, " or the cache");
    embed(id, x_.data());
    if (embed_scale_ != 1.f)
      for (int64_t i = 0; i < C_; ++i) x_[i] *= embed_scale_;
    const float *cs = cos_.data_ptr<float>() + p * rot2_, *sn = sin_.data_ptr<float>() + p * rot2_;
    const float *lcs = local_cos_.data_ptr<float>() + p * rot2_, *lsn = local_sin_.data_ptr<float>() + p * rot2_;
    const int64_t R = H_ / Hkv_, QKV = (H_ + 2 * Hkv_) * Dh_;
    for (const Layer& l : layers_) {
      rms_norm(x_.data(), l.attn_norm.data_ptr<float>(), C_, eps_, h_.data());
      tinyllm_cpu::matvec(l.wqkv, h_.data(), qkv_.data());  // (H + 2 Hkv) Dh: q, k, v
      float *q = qkv_.data(), *k = q + H_ * Dh_, *v = k + Hkv_ * Dh_;
      if (l.bqkv.defined()) {
        const float* b = l.bqkv.data_ptr<float>();
        for (int64_t i = 0; i < QKV; ++i) qkv_[i] += b[i];
      }
      if (l.q_norm.defined()) {  // each head of q and k over its Dh dims
        for (int64_t h = 0; h < H_; ++h) rms_norm(q + h * Dh_, l.q_norm.data_ptr<float>(), Dh_, eps_, q + h * Dh_);
        for (int64_t h = 0; h < Hkv_; ++h) rms_norm(k + h * Dh_, l.k_norm.data_ptr<float>(), Dh_, eps_, k + h * Dh_);
      }
      const float *c = l.window ? lcs : cs, *s = l.window ? lsn : sn;
      rope(q, H_, Dh_, rot2_, c, s);
      rope(k, Hkv_, Dh_, rot2_, c, s);
      if (l.k.scalar_type() == at::kFloat) store(l, k, v, p, l.k.data_ptr<float>(), l.v.data_ptr<float>());
      else if (l.k.scalar_type() == at::kChar) store_int8(l, k, v, p);
      else store(l, k, v, p, static_cast<tinyllm_cpu::bf16*>(l.k.data_ptr()), static_cast<tinyllm_cpu::bf16*>(l.v.data_ptr()));
      const int64_t from = l.window ? std::max(first, p - l.window + 1) : first;
      tinyllm_cpu::attend(q, R, l.k, l.v, from, p, scale_, att_.data(), attn_cap_, l.ks, l.vs);  // (Hkv, R, Dh)
      tinyllm_cpu::matvec(l.wo, att_.data(), o_.data());
      if (l.post_attn.defined()) rms_norm(o_.data(), l.post_attn.data_ptr<float>(), C_, eps_, o_.data());
      for (int64_t i = 0; i < C_; ++i) x_[i] += o_[i] * res_scale_;  // exact where the scale is 1
      rms_norm(x_.data(), l.ffn_norm.data_ptr<float>(), C_, eps_, h_.data());
      tinyllm_cpu::ffn(l.w13, l.w2, h_.data(), o_.data(), gelu_);
      if (l.post_ffn.defined()) rms_norm(o_.data(), l.post_ffn.data_ptr<float>(), C_, eps_, o_.data());
      for (int64_t i = 0; i < C_; ++i) x_[i] += o_[i] * res_scale_;  // exact where the scale is 1
    }
    rms_norm(x_.data(), norm_.data_ptr<float>(), C_, eps_, h_.data());
    at::Tensor logits = at::empty({1, 1, V_}, tok.options().dtype(at::kFloat));
    tinyllm_cpu::matvec(out_, h_.data(), logits.data_ptr<float>());
    if (logit_div_ != 1.f)
      for (float *v = logits.data_ptr<float>(), *end = v + V_; v < end; ++v) *v /= logit_div_;
    if (final_cap_ > 0.f) tinyllm_cpu::soft_cap(logits.data_ptr<float>(), V_, final_cap_);
    ++p;
    return logits;
  }

  // forward(), then the Sampler's greedy push and draw (StepSampler's ring, ring_at, penalty and DRY)
  // into tok.
  at::Tensor forward_greedy(const at::Tensor& tok, const at::Tensor& pos, const at::Tensor& first_valid,
                            int64_t window, const at::Tensor& ring, const at::Tensor& ring_at,
                            const at::Tensor& penalty, int64_t n_valid,
                            const at::Tensor& hist, const at::Tensor& dry,
                            const at::Tensor& dry_n, const at::Tensor& breaker) {
    at::Tensor logits = forward(tok, pos, first_valid, window);
    sampler_.greedy(logits, tok, ring, ring_at, penalty, n_valid, Dry{hist, dry, dry_n, breaker});
    return logits;
  }

  // forward(), then the Sampler's sampled push and draw (the StepSampler's settings tensors; the
  // counter advances).
  at::Tensor forward_sample(const at::Tensor& tok, const at::Tensor& pos, const at::Tensor& first_valid,
                            int64_t window, const at::Tensor& ring, const at::Tensor& ring_at,
                            const at::Tensor& penalty, int64_t n_valid,
                            const at::Tensor& hist, const at::Tensor& dry,
                            const at::Tensor& dry_n, const at::Tensor& breaker,
                            const at::Tensor& temperature,
                            const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& key,
                            const at::Tensor& counter) {
    at::Tensor logits = forward(tok, pos, first_valid, window);
    sampler_.sample(logits, tok, ring, ring_at, penalty, n_valid, Dry{hist, dry, dry_n, breaker}, temperature, top_k,
                    top_p, key, counter);
    return logits;
  }

 private:
  // k and v (Hkv, Dh) into the cache at (0, h, p, :), rounded to a bf16 cache as torch rounds
  // (tinyllm_cpu::bf16: nearest even), so the eager step's cache holds the same bits.
  template <class T>
  void store(const Layer& l, const float* k, const float* v, int64_t p, T* kc, T* vc) const {
    for (int64_t h = 0; h < Hkv_; ++h) {
      T* kr = kc + h * l.k.stride(1) + p * l.k.stride(2);
      T* vr = vc + h * l.v.stride(1) + p * l.v.stride(2);
      for (int64_t d = 0; d < Dh_; ++d) kr[d] = T(k[h * Dh_ + d]), vr[d] = T(v[h * Dh_ + d]);
    }
  }

  // k and v (Hkv, Dh) into an int8 cache at (0, h, p, :), each head with its scale at (0, h, p):
  // tinyllm.kv_cache.quantize_int8's bits (s = absmax / 127, round(x / s) half to even).
  void store_int8(const Layer& l, const float* k, const float* v, int64_t p) const {
    for (int64_t h = 0; h < Hkv_; ++h) {
      quantize_head(k + h * Dh_, l.k.data_ptr<int8_t>() + h * l.k.stride(1) + p * l.k.stride(2),
                    l.ks.data_ptr<float>() + h * l.ks.stride(1) + p);
      quantize_head(v + h * Dh_, l.v.data_ptr<int8_t>() + h * l.v.stride(1) + p * l.v.stride(2),
                    l.vs.data_ptr<float>() + h * l.vs.stride(1) + p);
    }
  }

  void quantize_head(const float* x, int8_t* q, float* s) const {
    float amax = 0.f;
    for (int64_t d = 0; d < Dh_; ++d) amax = std::max(amax, std::fabs(x[d]));
    const float sc = amax / 127.f;
    *s = sc;
    for (int64_t d = 0; d < Dh_; ++d)
      q[d] = static_cast<int8_t>(sc > 0.f ? std::clamp(std::nearbyint(x[d] / sc), -127.f, 127.f) : 0.f);
  }

  static at::Tensor fp32_vector(const at::Tensor& t, int64_t n, const char* what) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == n, what, " must be fp32 (", n, ")");
    return t;
  }

  at::Tensor table(const at::Tensor& t, const char* what) const {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 2 && t.size(1) == rot2_, what,
                " must be a contiguous fp32 table (L, rotary_dim / 2)");
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

  // x = row id of the embedding, dequantized or widened (quant_linear.QuantEmbedding, linear.DenseEmbedding).
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

  int64_t L_, C_, H_, Hkv_, F_, Dh_, V_, rows_, rot2_;  // rot2_: rotary_dim / 2
  bool gelu_;
  float eps_, embed_scale_, scale_, attn_cap_, final_cap_, res_scale_, logit_div_;
  at::Tensor emb_w_, emb_s_, emb_z_, norm_, cos_, sin_, local_cos_, local_sin_;
  Matrix out_;
  std::vector<Layer> layers_;
  TensorSampler sampler_;
  std::vector<float> x_, h_, o_, qkv_, att_;  // the residual row, a normed row, a product's row, q|k|v, attention
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(tinyllm_cpu, m) {
  m.class_<Step>("Step")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<double>>())
      .def("forward", &Step::forward)
      .def("forward_greedy", &Step::forward_greedy)
      .def("forward_sample", &Step::forward_sample);
  m.class_<SamplerClass>("Sampler")
      .def(torch::init<>())
      .def("greedy", &SamplerClass::greedy)
      .def("sample", &SamplerClass::sample);
}
