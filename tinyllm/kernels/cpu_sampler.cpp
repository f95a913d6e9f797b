// The decode step's sampler for one row (cpu_sampler.h states the contract).
#include "cpu_sampler.h"

#include <algorithm>
#include <cmath>

namespace tinyllm_cpu {

namespace {

// tinyllm.decode.sampling's 32-bit hash (_mix): xorshift-multiply on values in [0, 2^32).
constexpr uint64_t M32 = 0xFFFFFFFFull;
inline uint64_t mix(uint64_t x) {
  x ^= x >> 16;
  x = (x * 0x7FEB352Dull) & M32;
  x ^= x >> 15;
  x = (x * 0x2C1B3C6Dull) & M32;
  return x ^ (x >> 16);
}

}  // namespace

uint64_t salt_of(uint64_t key0, uint64_t key1, int64_t counter) {
  return mix(mix(key0 ^ (static_cast<uint64_t>(counter) & M32)) ^ key1);
}

float noise(uint64_t salt, uint64_t key1, int64_t j) {
  const uint64_t h = mix(mix(static_cast<uint64_t>(j) ^ salt) ^ key1);
  const float u = (static_cast<float>(h >> 8) + 0.5f) * (1.0f / (1 << 24));
  return -std::log(u);
}

void Sampler::push_and_penalize(const SamplerRow& row, int64_t id, const float* logits, int64_t V) {
  int64_t& at = *row.ring_at;
  row.ring[at] = id;
  at = (at + 1) % row.ring_len;
  x_.assign(logits, logits + V);
  std::fill(x_.begin() + row.n_valid, x_.end(), -INFINITY);
  for (int64_t i = 0; i < row.ring_len; ++i) {
    const int64_t r = row.ring[i];
    if (r < 0 || r >= row.n_valid) continue;  // ids past n_valid stay -inf
    const float v = logits[r];
    x_[r] = v > 0 ? v / row.penalty : v * row.penalty;
  }
  int64_t* h = row.hist;
  const int64_t H = row.hist_len;
  if (H > 0) {
    std::copy(h + 1, h + H, h);
    h[H - 1] = id;
  }
  if (row.dry_multiplier > 0.f && H >= 2) apply_dry(row, V);
}

void Sampler::apply_dry(const SamplerRow& row, int64_t V) {
  const int64_t* h = row.hist;
  const int64_t H = row.hist_len, start = H - std::min(row.dry_last_n, H), M = std::min(DRY_MAX_MATCH, H - 1);
  auto ends = [&](int64_t t) { return t < 0 || t >= V || row.breaker[t]; };  // a match stops at it
  dry_.clear();
  for (int64_t j = start; j + 1 < H; ++j) {  // an earlier span ending at j; the id after it is h[j + 1]
    int64_t run = 0;
    for (int64_t k = 0; k < M && j - k >= start; ++k) {
      const int64_t t = h[H - 1 - k];
      if (H - 1 - k < start || ends(t) || h[j - k] != t) break;
      ++run;
    }
    if (run >= row.dry_allowed)
      dry_.emplace_back(h[j + 1],
                        row.dry_multiplier * std::pow(row.dry_base, static_cast<float>(run - row.dry_allowed)));
  }
  std::sort(dry_.begin(), dry_.end());  // by id, then penalty: the last of an id's run is its largest
  for (size_t i = 0; i < dry_.size(); ++i)
    if (i + 1 == dry_.size() || dry_[i + 1].first != dry_[i].first) {
      const int64_t r = dry_[i].first;
      if (0 <= r && r < V) x_[r] -= dry_[i].second;
    }
}

int64_t Sampler::greedy() const {
  const int64_t V = static_cast<int64_t>(x_.size());
  int64_t best = 0;
  for (int64_t j = 1; j < V; ++j)
    if (x_[j] > x_[best] || (std::isnan(x_[j]) && !std::isnan(x_[best]))) best = j;
  return best;
}

int64_t Sampler::sample(const SampleSettings& s) {
  const uint64_t salt = salt_of(s.key0, s.key1, *s.counter);
  ++*s.counter;
  std::vector<float>& x = x_;
  const int64_t V = static_cast<int64_t>(x.size());
  for (float& v : x) v /= s.temperature;
  cand_.clear();
  for (int64_t j = 0; j < V; ++j)
    if (x[j] != -INFINITY) cand_.push_back(static_cast<int32_t>(j));
  if (cand_.empty()) return 0;
  auto desc = [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  if (s.top_k > 0 && s.top_k < V) {  // the k-th largest of all V values (-inf ones included)
    float kth = -INFINITY;
    if (static_cast<int64_t>(cand_.size()) >= s.top_k) {
      std::nth_element(cand_.begin(), cand_.begin() + (s.top_k - 1), cand_.end(), desc);
      kth = x[cand_[s.top_k - 1]];
    }
    cand_.erase(std::remove_if(cand_.begin(), cand_.end(), [&](int32_t j) { return x[j] < kth; }), cand_.end());
  }
  if (s.top_p < 1.f) {
    float m = -INFINITY;
    for (int32_t j : cand_) m = std::max(m, x[j]);
    float z = 0.f;
    for (int32_t j : cand_) z += std::exp(x[j] - m);
    size_t sorted = 0, want = std::min<size_t>(64, cand_.size());
    double mass = 0.0;
    for (size_t i = 0;; ++i) {
      if (i == sorted) {  // sort the next stretch of the largest values
        want = std::min(cand_.size(), std::max(want, 2 * sorted));
        std::partial_sort(cand_.begin() + sorted, cand_.begin() + want, cand_.end(), desc);
        sorted = want;
      }
      if (i == cand_.size()) break;
      const float p = std::exp(x[cand_[i]] - m) / z;
      if (static_cast<float>(mass + p) - p >= s.top_p) {  // this value and every smaller one go
        cand_.resize(i);
        break;
      }
      mass += p;
    }
  }
  float m = -INFINITY;
  for (int32_t j : cand_) m = std::max(m, x[j]);
  float z = 0.f;
  for (int32_t j : cand_) z += std::exp(x[j] - m);
  int64_t best = cand_[0];
  float best_v = -1.f;
  for (int32_t j : cand_) {
    const float v = std::exp(x[j] - m) / z / noise(salt, s.key1, j);
    if (v > best_v || (v == best_v && j < best)) best = j, best_v = v;
  }
  return best;
}

}  // namespace tinyllm_cpu
