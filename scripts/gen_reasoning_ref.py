#!/usr/bin/env python3
"""Generate the reference the reasoning-history template test compares against.

    scripts/gen_reasoning_ref.py LLAMA_CPP_DIR > tests/data/tokenizer/reasoning_history.json

Renders real reasoning models' templates from llama.cpp's `models/templates/` with Python's
jinja2, configured as `gen_tokenizer_ref.py templates` does (Hugging Face's
`apply_chat_template`), for a conversation whose earlier assistant turn carries its reasoning
apart from its content, the way llama.cpp hands it to a template: `reasoning_content`, and for
gpt-oss's harmony template also `thinking` (`common/parsers/gpt-oss.cpp`). What each template
keeps of that reasoning is what the next prompt must hold. `expected_last` renders the
conversation cut after that assistant turn, without a generation prompt: there gpt-oss's and
Qwen3's templates do show the reasoning, which proves that the fields reach them.
"""

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_tokenizer_ref as ref  # noqa: E402

TEMPLATES = [
    ("openai-gpt-oss-120b", "<|startoftext|>", "<|return|>", True),
    ("Qwen-Qwen3-0.6B", "", "<|im_end|>", False),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", False),
    ("HuggingFaceTB-SmolLM3-3B", "", "<|im_end|>", False),
]

REASONING = "The user greets me. I should greet back and offer help."


def conversation(harmony):
    assistant = {"role": "assistant", "content": "Hi there, how can I help?",
                 "reasoning_content": REASONING}
    if harmony:
        assistant["thinking"] = REASONING
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello!"},
        assistant,
        {"role": "user", "content": "What is the capital of France?"},
    ]


def render_last(env, source, messages, bos, eos):
    now = ref.datetime.datetime.fromtimestamp(ref.FIXED_TIME)
    return env.from_string(source).render(
        messages=messages, add_generation_prompt=False, bos_token=bos, eos_token=eos,
        tools=None, enable_thinking=True, date_string=now.strftime("%d %b %Y"),
        datetime=now.strftime("%b %d %Y"))


def main():
    llama_dir = sys.argv[1]
    env = ref.hf_environment()
    cases = []
    for name, bos, eos, harmony in TEMPLATES:
        file = f"models/templates/{name}.jinja"
        with open(os.path.join(llama_dir, file), encoding="utf-8") as f:
            source = f.read()
        messages = conversation(harmony)
        cases.append({
            "name": name,
            "file": file,
            "sha256": hashlib.sha256(source.encode()).hexdigest(),
            "bos_token": bos,
            "eos_token": eos,
            "reasoning": REASONING,
            "messages": messages,
            "expected": ref.render_hf(env, source, messages, bos, eos),
            # Ending with the assistant's turn, no generation prompt: the templates that show a
            # last turn's reasoning (gpt-oss's, Qwen3's) show it, so the field reached them.
            "expected_last": render_last(env, source, messages[:3], bos, eos),
        })
    json.dump({"generated_by": "scripts/gen_reasoning_ref.py (llama.cpp b11434 templates, jinja2 "
               + __import__("jinja2").__version__ + ")", "now_unix": ref.FIXED_TIME,
               "cases": cases}, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
