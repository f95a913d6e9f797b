// The decode step's sampler for one row in C++: the push and draw of tinyllm.decode.step_sampler's
// StepSampler, on its own tensors' memory (plain C++, no torch header: cpu_sampler.cpp).
//
// Contract (namespace tinyllm_cpu):
//   SamplerRow: one row's state, read and advanced in place: the ring of the penalty's window
//     (ring_len ids) and where the next id goes (ring_at), the repetition penalty, n_valid
//     (ids from there on are never drawn).
//   Sampler::push_and_penalize(row, id, logits, V): ring[ring_at] = id, ring_at advances (mod
//     ring_len); then the sampler's row of scores is logits (V) with ids from n_valid on -inf
//     and the penalty at the ring's ids (positive scores divided by it, negative ones
//     multiplied: tinyllm.decode.sampling.apply_repeat_penalty).
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
#include <vector>

namespace tinyllm_cpu {

struct SamplerRow {
  int64_t* ring;
  int64_t ring_len;
  int64_t* ring_at;
  float penalty;
  int64_t n_valid;
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
};

}  // namespace tinyllm_cpu
