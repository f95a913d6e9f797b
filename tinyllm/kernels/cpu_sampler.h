// The decode step's sampler for one row in C++: the push and draw of tinyllm.decode.step_sampler's
// StepSampler, on its own tensors' memory (plain C++, no torch header: cpu_sampler.cpp).
//
// Contract (namespace tinyllm_cpu):
//   SamplerRow: one row's state, read and advanced in place: the ring of the penalty's window
//     (ring_len ids) and where the next id goes (ring_at), the repetition penalty, n_valid
//     (ids from there on are never drawn); DRY's history (hist_len ids, oldest first, -1: none)
//     and settings (multiplier, 0: off; base; allowed length; last-n), breaker (V flags: the
//     ids that end a DRY match).
//   Sampler::push_and_penalize(row, id, logits, V): ring[ring_at] = id, ring_at advances (mod
//     ring_len), the history shifts one left and ends with id; then the sampler's row of scores
//     is logits (V) with ids from n_valid on -inf and the penalty at the ring's ids (positive
//     scores divided by it, negative ones multiplied: tinyllm.decode.sampling.apply_repeat_penalty),
//     less DRY's penalty (sampling.apply_dry: for each earlier end j of the history's latest
//     span, matched back at most DRY_MAX_MATCH ids and never across a breaker, the id after j
//     loses multiplier * base^(match - allowed) where match >= allowed, the largest of those).
//   Sampler::greedy(): the argmax of those scores, the first of equal maxima (torch.argmax).
//   Sampler::sample(settings): sampling.draw_sorted's draw with sampling.noise_at's noise for
//     draw `*counter` of seed (key0, key1); the counter advances. Scores / temperature; top-k
//     keeps values >= the k-th largest; top-p keeps the largest values while the softmax mass
//     before each is below top_p (summed in double, as torch.cumsum does on a CPU); then the
//     argmax of softmax / noise. Only the values top-k and top-p keep are sorted (a partial
//     sort that grows until the mass is reached), and noise is computed only for them.
//   noise(salt, key1, j): the Exponential(1) noise of id j (noise_at, batch 1); salt_of(key0,
//     key1, counter): a draw's salt.
// Equal to the Python sampler for the same seed, logits and settings up to float rounding
// (only a near-tie that rounding decides could differ): tests/tinyllm/test_step_sampler.py.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace tinyllm_cpu {

constexpr int64_t DRY_MAX_MATCH = 32;  // tinyllm.decode.sampling_params.DRY_MAX_MATCH

struct SamplerRow {
  int64_t* ring;
  int64_t ring_len;
  int64_t* ring_at;
  float penalty;
  int64_t n_valid;
  int64_t* hist;
  int64_t hist_len;
  float dry_multiplier, dry_base;
  int64_t dry_allowed, dry_last_n;
  const bool* breaker;
};

struct SampleSettings {
  float temperature;
  int64_t top_k;
  float top_p;
  uint64_t key0, key1;
  int64_t* counter;
};

uint64_t salt_of(uint64_t key0, uint64_t key1, int64_t counter);
float noise(uint64_t salt, uint64_t key1, int64_t j);

class Sampler {
 public:
  void push_and_penalize(const SamplerRow& row, int64_t id, const float* logits, int64_t V);
  int64_t greedy() const;
  int64_t sample(const SampleSettings& s);

 private:
  std::vector<float> x_;  // the penalized scores of a draw (scratch for a sampled one)
  std::vector<int32_t> cand_;  // the ids a sampled draw still considers
  std::vector<std::pair<int64_t, float>> dry_;  // DRY's (id, penalty) candidates of a draw
  void apply_dry(const SamplerRow& row, int64_t V);
};

}  // namespace tinyllm_cpu
