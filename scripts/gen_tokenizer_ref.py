#!/usr/bin/env python3
"""Generate the reference data the tokenizer and chat-template tests compare against.

    scripts/gen_tokenizer_ref.py tokens MODEL.gguf LLAMA_CPP_DIR > tests/data/tokenizer/smollm2.json
    scripts/gen_tokenizer_ref.py templates LLAMA_CPP_DIR > tests/data/tokenizer/chat_templates.json

`tokens`: tokenizes a varied set of strings with llama.cpp's own tokenizer, by running its
`llama-tokenize` tool (built in LLAMA_CPP_DIR/build/bin) once per string and per
parse-special setting, exactly as:

    llama-tokenize -m MODEL -f INPUT_FILE --no-escape --ids --log-disable [--no-parse-special]

(`-f` with `--no-escape` passes the bytes verbatim, trailing newlines included). It also records
the special tokens llama.cpp reports when it loads the vocabulary (`print_info:` lines).

`templates`: extracts the chat-template cases of llama.cpp's `tests/test-chat-template.cpp` (its
list of real templates with the prompts its Jinja engine must produce for a fixed conversation),
and renders a selection of the real templates in `models/templates/*.jinja` with Python's jinja2
configured as Hugging Face's `apply_chat_template` does (trim_blocks, lstrip_blocks,
raise_exception, strftime_now), at a fixed time so that dated templates are reproducible: each on
llama.cpp's six-message conversation and on MORE_CONVERSATIONS (a template's raise_exception is
recorded as `raises`, its message). Real templates llama.cpp's tree lacks are read from
tests/data/tokenizer/templates/ (REPO_TEMPLATES; sources and licences in its SOURCES.md).
"""

import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

# Inputs for `tokens`: scripts, whitespace, code, numbers, special tokens and their near misses.
INPUTS = [
    "",
    " ",
    "  ",
    "Hello",
    " Hello",
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done what we'd said. It's John's.",
    "DON'T SHOUT, I'LL HEAR YOU",
    "café naïve résumé façade Ångström",
    "Straße, Größe, Übermaß",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "مرحبا بالعالم",
    "שלום עולם",
    "你好，世界！今天天气很好。",
    "こんにちは世界、カタカナとひらがな",
    "안녕하세요 세계",
    "नमस्ते दुनिया",
    "e\u0301 vs \u00e9, combining marks: a\u0308o\u0308u\u0308",
    "👋🌍🎉 emoji: 😀😃😄😁 and a family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "Zero\u200bwidth\u200djoiner and no\u00a0break\u00a0space",
    "   leading spaces",
    "trailing spaces   ",
    "a  b   c    d     e",
    "\t\ttabs\tand\ttabs",
    "\n",
    "\n\n\n",
    "line one\nline two\n\nline four\n",
    "windows\r\nline\r\nendings\r\n",
    "mixed \n \t \r\n whitespace\u3000ideographic",
    "3.14159 1,000,000 2024-11-22 0x1F 1e-9 -42 +7 100%",
    "1234567890 12345678901234567890",
    "٠١٢٣ Arabic-Indic digits and ²³ superscripts ½",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{v:?}\");\n}\n",
    "<div class=\"a\">&amp; &lt;tag&gt;</div>",
    '{"key": [1, 2.5, true, null], "nested": {"k": "v"}}',
    "https://example.com/path?query=1&other=two#frag",
    "user@example.org, C:\\Windows\\System32, ~/.config/app.toml",
    "∑∫√∞ ≠ ≤ ≥ ± × ÷ → ⇒ ∀x∈ℝ",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!???...,,,;;;:::---___***",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more text<|endoftext|>",
    "<|im_start|><|im_end|><|im_start|>",
    "  <|im_start|>  spaced  <|im_end|>  ",
    "<|im_start", "im_end|>", "<|im_start|", "<| im_start |>", "<|IM_START|>",
    "<repo_name>hipscope<file_sep>src/main.rs<filename>",
    "<jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "<think>reasoning</think> answer",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was "
    "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it "
    "was the season of Light, it was the season of Darkness, it was the spring of hope, it "
    "was the winter of despair.",
]


def llama_tokenize(tool, model, text, parse_special):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [tool, "-m", model, "-f", path, "--no-escape", "--ids", "--log-disable"]
        if not parse_special:
            cmd.append("--no-parse-special")
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    lines = [l for l in out.splitlines() if l.startswith("[")]
    if len(lines) != 1:
        sys.exit(f"unexpected llama-tokenize output for {text!r}: {out!r}")
    return json.loads(lines[0])


def vocab_info(tool, model):
    """The special tokens llama.cpp reports while loading (its print_info log lines)."""
    log = subprocess.run([tool, "-m", model, "-p", "x", "--ids", "-lv", "4"], check=True,
                         capture_output=True, text=True).stderr
    info = {"eog": []}
    for m in re.finditer(r"print_info: (BOS|EOS|EOT|EOG|UNK|PAD|n_vocab)\s*(?:token)?\s*=\s*(\d+)", log):
        key, val = m.group(1).lower(), int(m.group(2))
        if key == "eog":
            info["eog"].append(val)
        else:
            info[key] = val
    return info


def cmd_tokens(model, llama_dir):
    tool = os.path.join(llama_dir, "build", "bin", "llama-tokenize")
    cases = []
    for text in INPUTS:
        for parse_special in (True, False):
            cases.append({
                "text": text,
                "parse_special": parse_special,
                "ids": llama_tokenize(tool, model, text, parse_special),
            })
    data = {
        "generated_by": "scripts/gen_tokenizer_ref.py tokens (llama.cpp llama-tokenize, b11434)",
        "model": os.path.basename(model),
        "model_sha256": sha256_file(model),
        "vocab": vocab_info(tool, model),
        "cases": cases,
    }
    dump_compact(data, "cases")


def dump_compact(data, list_key):
    """Pretty JSON with one line per entry of `data[list_key]`, for readable diffs."""
    items = data.pop(list_key)
    head = json.dumps(data, ensure_ascii=False, indent=1)
    lines = ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in items)
    print(head[:-2] + f',\n "{list_key}": [\n{lines}\n ]\n}}')


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# templates

def c_string_literals(src, pos):
    """Parses a run of adjacent C++ string literals (optionally wrapped in U8C(...)) at `pos`;
    returns (value, end)."""
    out = []
    i = pos
    while True:
        while src[i].isspace():
            i += 1
        if src.startswith("U8C(", i):
            val, i = c_string_literals(src, i + 4)
            while src[i].isspace():
                i += 1
            assert src[i] == ")", src[i:i + 20]
            out.append(val)
            i += 1
            continue
        if src.startswith("u8\"", i):
            i += 2
        if src[i] != '"':
            return "".join(out), i
        i += 1
        buf = []
        while src[i] != '"':
            c = src[i]
            if c == "\\":
                n = src[i + 1]
                simple = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'", "0": "\0"}
                if n in simple:
                    buf.append(simple[n])
                    i += 2
                    continue
                sys.exit(f"unsupported escape \\{n}")
            buf.append(c)
            i += 1
        out.append("".join(buf))
        i += 1


def parse_test_cases(src):
    """The TestCase initializers of test-chat-template.cpp's `main_automated_tests`."""
    start = src.index("std::vector<TestCase> test_cases {")
    body_start = src.index("{", start + len("std::vector<TestCase> test_cases"))
    i = body_start + 1
    cases = []
    conversation = parse_conversation(src)
    while True:
        while src[i].isspace() or src[i] == ",":
            i += 1
        if src[i] == "}":
            break
        assert src[i] == "{", src[i:i + 40]
        i += 1
        fields = []
        while True:
            # skip whitespace, commas and comments
            while True:
                while src[i].isspace() or src[i] == ",":
                    i += 1
                if src.startswith("/*", i):
                    i = src.index("*/", i) + 2
                elif src.startswith("//", i):
                    i = src.index("\n", i)
                else:
                    break
            if src[i] == "}":
                i += 1
                break
            if src[i] in '"U' or src.startswith('u8"', i):
                val, i = c_string_literals(src, i)
                fields.append(val)
            elif src.startswith("true", i) or src.startswith("false", i):
                val = src.startswith("true", i)
                i += 4 if val else 5
                fields.append(val)
            elif src[i] == "{":
                # extra_conversation: {{"role", "content"}, ...}
                depth, j = 0, i
                while True:
                    if src[j] == "{":
                        depth += 1
                    elif src[j] == "}":
                        depth -= 1
                        if depth == 0:
                            break
                    elif src[j] == '"':
                        _, j = c_string_literals(src, j)
                        continue
                    j += 1
                extra = []
                for m in re.finditer(r'\{\s*"', src[i + 1:j]):
                    k = i + 1 + m.start() + 1
                    role, k = c_string_literals(src, k)
                    while src[k] in " ,\n":
                        k += 1
                    content, k = c_string_literals(src, k)
                    extra.append({"role": role, "content": content})
                fields.append(extra)
                i = j + 1
            else:
                sys.exit(f"cannot parse test case field at: {src[i:i + 60]!r}")
        name, template, expected, expected_jinja = fields[:4]
        rest = fields[4:]
        bos = rest[0] if len(rest) > 0 else ""
        eos = rest[1] if len(rest) > 1 else ""
        supported = rest[2] if len(rest) > 2 else True
        extra = rest[3] if len(rest) > 3 else []
        if not supported:
            continue
        cases.append({
            "name": name,
            "source": "llama.cpp tests/test-chat-template.cpp",
            "template": template,
            "bos_token": bos,
            "eos_token": eos,
            "messages": conversation + extra,
            "expected": expected_jinja or expected,
        })
    return cases


def parse_conversation(src):
    start = src.index("std::vector<llama_chat_message> conversation {")
    end = src.index("};", start)
    conv = []
    for m in re.finditer(r'\{\s*"', src[start + 45:end]):
        k = start + 45 + m.start() + 1
        role, k = c_string_literals(src, k)
        while src[k] in " ,\n":
            k += 1
        content, k = c_string_literals(src, k)
        conv.append({"role": role, "content": content})
    return conv


# Real templates from llama.cpp's models/templates, rendered with jinja2 as transformers does.
REAL_TEMPLATES = [
    ("meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    ("meta-llama-Llama-3.2-3B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    ("meta-llama-Llama-3.3-70B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    ("Qwen-Qwen2.5-7B-Instruct", "", "<|im_end|>"),
    ("Qwen-Qwen3-0.6B", "", "<|im_end|>"),
    ("Qwen-QwQ-32B", "", "<|im_end|>"),
    ("mistralai-Mistral-Nemo-Instruct-2407", "<s>", "</s>"),
    ("google-gemma-2-2b-it", "<bos>", "<eos>"),
    ("microsoft-Phi-3.5-mini-instruct", "<s>", "<|endoftext|>"),
    ("HuggingFaceTB-SmolLM3-3B", "", "<|im_end|>"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("ibm-granite-granite-3.3-2B-Instruct", "", "<|end_of_text|>"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "<|begin_of_text|>", "<|im_end|>"),
    ("openai-gpt-oss-120b", "<|startoftext|>", "<|return|>"),
]

# Real templates that llama.cpp's tree lacks, kept in tests/data/tokenizer/templates/ (each with
# its source and licence in SOURCES.md there): (name, bos, eos).
REPO_TEMPLATES = [
    ("microsoft-Phi-4-mini-instruct", "<|endoftext|>", "<|endoftext|>"),
    ("google-gemma-3-it", "<bos>", "<end_of_turn>"),
]
REPO_TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                                 "tokenizer", "templates")

# 2024-07-26 12:00 UTC: noon, so that the local date is the same in nearly every time zone.
FIXED_TIME = 1721995200

TWO_TURNS = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi there, how can I help?"},
    {"role": "user", "content": "What is the capital of France?"},
]


# More conversations every real template is rendered with, as (name, messages,
# add_generation_prompt): no system message, a system message alone before one user message,
# a finished conversation (no generation prompt) whose texts carry surrounding whitespace, and
# roles that do not alternate (two user messages; an assistant first), which templates such as
# Gemma's refuse with raise_exception.
MORE_CONVERSATIONS = [
    ("no system", [{"role": "user", "content": "Hello!"}], True),
    ("system and one user", [{"role": "system", "content": "Answer in French."},
                             {"role": "user", "content": "What is the capital of France?"}], True),
    ("finished, padded texts", TWO_TURNS[1:] + [
        {"role": "assistant", "content": "  Paris.\n"},
        {"role": "user", "content": "\n Thanks! \t"},
        {"role": "assistant", "content": "You're welcome."}], False),
    ("two user messages", [{"role": "user", "content": "Hello!"},
                           {"role": "user", "content": "Anyone there?"}], True),
    ("assistant first", [{"role": "assistant", "content": "How can I help?"},
                         {"role": "user", "content": "Hello!"}], True),
]


def hf_environment():
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(FIXED_TIME).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_hf(env, source, messages, bos, eos, add_generation_prompt=True):
    now = datetime.datetime.fromtimestamp(FIXED_TIME)
    return env.from_string(source).render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos,
        eos_token=eos,
        tools=None, enable_thinking=True, date_string=now.strftime("%d %b %Y"),
        datetime=now.strftime("%b %d %Y"))


def merge_system(messages):
    """llama.cpp's fallback for templates that ignore or refuse a system message."""
    if messages and messages[0]["role"] == "system":
        if len(messages) > 1:
            first = dict(messages[1])
            first["content"] = messages[0]["content"] + "\n" + first["content"]
            return [first] + messages[2:]
        return messages[1:]
    return messages


def supports_system(env, source):
    probe = [{"role": "system", "content": "System message"},
             {"role": "user", "content": "User message"}]
    try:
        return "System message" in render_hf(env, source, probe, "", "")
    except Exception:
        return False


def cmd_templates(llama_dir):
    src = open(os.path.join(llama_dir, "tests", "test-chat-template.cpp"), encoding="utf-8").read()
    cases = parse_test_cases(src)
    env = hf_environment()
    real = []
    todo = [(n, b, e, os.path.join(llama_dir, "models", "templates", n + ".jinja"),
             f"models/templates/{n}.jinja") for n, b, e in REAL_TEMPLATES]
    todo += [(n, b, e, os.path.join(REPO_TEMPLATE_DIR, n + ".jinja"),
              f"tests/data/tokenizer/templates/{n}.jinja") for n, b, e in REPO_TEMPLATES]
    for name, bos, eos, path, file in todo:
        source = open(path, encoding="utf-8").read()
        messages = TWO_TURNS if supports_system(env, source) else merge_system(TWO_TURNS)
        try:
            expected = render_hf(env, source, messages, bos, eos)
        except Exception as e:  # the reference engine cannot render it: leave it out
            print(f"{name}: jinja2 cannot render it ({e}); skipped", file=sys.stderr)
            continue
        more = []
        for what, conv, gen in MORE_CONVERSATIONS:
            case = {"what": what, "messages": conv, "add_generation_prompt": gen}
            try:
                case["expected"] = render_hf(env, source, conv if messages is TWO_TURNS
                                             else merge_system(conv), bos, eos, gen)
            except Exception as e:
                import jinja2
                if not isinstance(e, jinja2.exceptions.TemplateError):
                    print(f"{name}, {what}: jinja2 fails ({e!r}); skipped", file=sys.stderr)
                    continue
                # raise_exception's message, which hipscope's error must quote.
                case["raises"] = str(e)
            more.append(case)
        real.append({
            "name": name,
            "file": file,
            "sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(),
            "bos_token": bos,
            "eos_token": eos,
            "messages": TWO_TURNS,
            "system_merged": messages is not TWO_TURNS,
            "expected": expected,
            "more": more,
        })
    data = {
        "generated_by": "scripts/gen_tokenizer_ref.py templates (llama.cpp b11434 sources, jinja2 "
                        + __import__("jinja2").__version__ + ")",
        "now_unix": FIXED_TIME,
        "inline_cases": cases,
        "real_templates": real,
    }
    json.dump(data, sys.stdout, ensure_ascii=False, indent=1)
    print()


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "tokens":
        cmd_tokens(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "templates":
        cmd_templates(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
