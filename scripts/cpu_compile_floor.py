"""What a torch.compile'd CPU call costs before any real work, by the number of tensors it reads
(docs/BENCHMARKS-LOG.md): a module of N small parameters whose compiled forward
(the decode step's options: Inductor, cpp_wrapper, one-thread kernels, dynamic sizes) adds them
up and writes one buffer. Dynamo's guards, AOTAutograd's wrapper and the C++ wrapper's handles
all grow with N; the compiled decode step reads every weight tensor of the model this way
(about 90 for the default model, 430 for SmolLM2-135M kept int4).

    python scripts/cpu_compile_floor.py [N ...]
"""

import sys
import time

import torch
import torch._dynamo


class Sum(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.ws = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(64), requires_grad=False) for _ in range(n)])
        self.x = torch.zeros(64)

    def forward(self, w: int) -> torch.Tensor:
        acc = self.x[:w]
        for p in self.ws:
            acc = acc + p[:w]
        self.x[:w].copy_(acc * 0.5)
        return acc


def main() -> None:
    torch.set_num_threads(2)
    torch._dynamo.config.specialize_float = True
    for n in [int(a) for a in sys.argv[1:]] or [10, 90, 430]:
        m = Sum(n)
        f = torch.compile(m.forward, backend="inductor", fullgraph=True, dynamic=True,
                          options={"cpp.threads": 1, "cpp_wrapper": True})
        with torch.no_grad():
            for _ in range(3):
                f(48)
            t0 = time.perf_counter()
            for _ in range(2000):
                f(48)
        print(f"{n} tensors: {(time.perf_counter() - t0) / 2000 * 1e6:.1f} us a call", flush=True)


if __name__ == "__main__":
    main()
