"""Print the model card's sample conversations: the first N prompts of a fixed list, each a new
chat, greedy with the app's repeat penalty (1.1), its matrices as the app holds them, on the CPU.

    python scripts/model_card_samples.py [MODEL] [N]
"""

import sys

from tinyllm.decode.sampling import SamplingParams
from tinyllm.session.chat import open_session

PROMPTS = [
    "Hello!",
    "What is the capital of France?",
    "Tell me a joke.",
    "What is a cat?",
    "How do I make a cup of tea?",
    "Can you write a short poem about the sea?",
    "What does the word 'ephemeral' mean?",
    "I feel a bit sad today.",
    "What is 12 plus 7?",
    "Give me three tips for sleeping better.",
    "Who wrote Romeo and Juliet?",
    "What is your favorite color?",
]

model = sys.argv[1] if len(sys.argv) > 1 else "models/tinychat"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
params = SamplingParams(max_tokens=200, repeat_penalty=1.1)  # the app's defaults
session = open_session(model, "cpu", params=params, quant="auto")
for i, prompt in enumerate(PROMPTS[:n], 1):
    session.new_chat()
    events = list(session.send(prompt))
    print(f"{i}. **User:** {prompt}\n\n   **tinychat:** {events[-1].text.strip()}  \n"
          f"   _({events[-1].reason}, {events[-1].stats.tokens} tokens)_\n")
