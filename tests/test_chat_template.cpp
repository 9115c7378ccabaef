// Chat templates: family detection from template sources, and renderings per family.
//
// The sources below are written here to resemble the families' published Jinja templates.
// Every expected rendering was derived by hand, by stepping through the template text shown
// beside it (Jinja as transformers runs it: trim_blocks and lstrip_blocks on, `|trim` binding
// tighter than `+`); none was produced by running a Jinja engine.
#include "runtime/chat_template.hpp"
#include "runtime/gguf.hpp"
#include "runtime/jinja/jinja.hpp"
#include "runtime/tokenizer.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <sstream>
#include <vector>

using namespace tandem;

namespace {

const char* llama2_src =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

const char* llama3_src =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

const char* llama31_src =
    "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n"
    "{%- endif %}\n{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = "
    "messages[0]['content']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set "
    "system_message = \"\" %}\n{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n{{- \"<|eot_id|>\" }}\n{%- for message in messages %}\n    {{- "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n";

// Llama 3.2's opening: today's date when the renderer offers strftime_now.
const char* llama32_src =
    "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- if strftime_now is defined %}\n"
    "        {%- set date_string = strftime_now(\"%d %b %Y\") %}\n    {%- else %}\n        {%- set date_string = "
    "\"26 Jul 2024\" %}\n    {%- endif %}\n{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n{{- \"<|eot_id|>\" }}\n";

const char* chatml_src =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const char* qwen2_src =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const char* qwen25_src =
    "{%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba "
    "Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == "
    "\"assistant\" and not message.tool_calls) %}\n        {{- '<|im_start|>' + message.role + '\\n' + "
    "message.content + '<|im_end|>' + '\\n' }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n";

// Mistral-7B-Instruct-v0.1's first template: no system role, no spaces before [INST].
const char* mistral_v01_src =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] "
    "== 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}";

// The later v1-tokenizer template: an optional system message joins the first user turn.
const char* mistral_v1_src =
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == "
    "'user') != (loop.index0 % 2 == 0) %}\n        {{- raise_exception('After the optional system message, "
    "conversation roles must alternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if "
    "message['role'] == 'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- "
    "' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n"
    "            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif "
    "message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n"
    "        {{- raise_exception('Only user and assistant roles are supported, with the exception of an "
    "initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n";

// The v3-tokenizer template (Mistral-7B-Instruct-v0.3), its tool branches left out: no
// spaces around [INST]/[/INST], the system text in the last user turn, answers trimmed.
const char* mistral_v3_src =
    "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == "
    "\"user\" %}\n        {%- if loop.last and system_message is defined %}\n            {{- \"[INST] \" + "
    "system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n            "
    "{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n    {%- elif "
    "message[\"role\"] == \"assistant\" %}\n        {{- \" \" + message[\"content\"]|trim + eos_token}}\n"
    "    {%- else %}\n        {{- raise_exception(\"Only user and assistant roles are supported, with the "
    "exception of an initial optional system message!\") }}\n    {%- endif %}\n{%- endfor %}\n";

const char* zephyr_src =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

const char* gemma_src =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";

const char* phi3_src =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + "
    "'<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}";

const char* alpaca_src =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '### Instruction:\\n' + message['content'] "
    "+ '\\n\\n' }}{% elif message['role'] == 'assistant' %}{{ '### Response:\\n' + message['content'] + "
    "eos_token + '\\n\\n' }}{% endif %}{% endfor %}";

const std::vector<chat_message> sys_user{{"system", "You are terse."}, {"user", "Hi there!"}};
const std::vector<chat_message> dialog{
    {"user", "Hi"}, {"assistant", "Hello."}, {"user", "How are you?"}};
const std::vector<chat_message> sys_dialog{
    {"system", "Be kind."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "How are you?"}};

} // namespace

TEST_CASE("families are recognised from their template sources") {
    CHECK(detect_chat_family(llama2_src) == chat_family::llama2);
    CHECK(detect_chat_family(llama3_src) == chat_family::llama3);
    CHECK(detect_chat_family(llama31_src) == chat_family::llama3);
    CHECK(detect_chat_family(chatml_src) == chat_family::chatml);
    CHECK(detect_chat_family(qwen2_src) == chat_family::chatml);
    CHECK(detect_chat_family(qwen25_src) == chat_family::chatml);
    CHECK(detect_chat_family(mistral_v01_src) == chat_family::mistral);
    CHECK(detect_chat_family(mistral_v1_src) == chat_family::mistral);
    CHECK(detect_chat_family(mistral_v3_src) == chat_family::mistral);
    CHECK(detect_chat_family(zephyr_src) == chat_family::zephyr);
    CHECK(detect_chat_family(gemma_src) == chat_family::gemma);
    CHECK(detect_chat_family(phi3_src) == chat_family::phi3);
    CHECK(detect_chat_family(alpaca_src) == chat_family::plain);
    CHECK(detect_chat_family("") == chat_family::plain);
    CHECK(name_of(chat_family::llama3) == "llama-3");
    CHECK(name_of(chat_family::plain) == "plain");
}

TEST_CASE("llama-2: <<SYS>> block inside the first [INST], BOS before every user turn") {
    const auto t = chat_template::parse(llama2_src, "<s>", "</s>");
    // bos + '[INST] ' + strip('<<SYS>>\n' + sys + '\n<</SYS>>\n\n' + user) + ' [/INST]'
    CHECK(t.render(sys_user) == "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there! [/INST]");
    // assistant: ' ' + strip(content) + ' ' + eos
    CHECK(t.render(dialog) == "<s>[INST] Hi [/INST] Hello. </s><s>[INST] How are you? [/INST]");
    CHECK(t.render(std::vector<chat_message>{{"user", "  padded \n"}}) == "<s>[INST] padded [/INST]");
    // The template has no generation-prompt branch: the prompt is the same either way.
    CHECK(t.render(dialog, false) == t.render(dialog, true));
}

TEST_CASE("llama-3: headers, trimmed content, BOS once") {
    const auto t = chat_template::parse(llama3_src, "<|begin_of_text|>", "<|eot_id|>");
    CHECK(t.render(sys_user) ==
          "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK(t.render(std::vector<chat_message>{{"user", " x \n"}}, false) ==
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");

    // 3.1: a system header with the knowledge and today's dates, always there.
    const auto t31 = chat_template::parse(llama31_src, "<|begin_of_text|>", "<|eot_id|>");
    const std::string head31 = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                               "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
    CHECK(t31.render(sys_user) == head31 + "You are terse.<|eot_id|>"
                                           "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
                                           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK(t31.render(std::vector<chat_message>{{"user", "Hi"}}) ==
          head31 + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST_CASE("llama-3.2: today's date in the system header") {
    const auto t = chat_template::parse(llama32_src, "<|begin_of_text|>", "<|eot_id|>");
    CHECK(t.family() == chat_family::llama3);
    auto today = [] {
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char buf[32];
        std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
        return std::string("Today Date: ") + buf + "\n\n<|eot_id|>";
    };
    const std::string before = today();
    const std::string text = t.render(std::vector<chat_message>{{"user", "Hi"}});
    CHECK((text.find(before) != std::string::npos || text.find(today()) != std::string::npos)); // midnight
}

TEST_CASE("chatml / qwen: turns verbatim, Qwen's default system turn") {
    const auto t = chat_template::parse(chatml_src, "", "<|im_end|>");
    CHECK(t.render(sys_user) == "<|im_start|>system\nYou are terse.<|im_end|>\n"
                                "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n");
    CHECK(t.render(dialog, false) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
                                     "<|im_start|>user\nHow are you?<|im_end|>\n");
    CHECK(t.render(std::vector<chat_message>{{"user", " a "}}) == "<|im_start|>user\n a <|im_end|>\n<|im_start|>assistant\n");

    const auto q2 = chat_template::parse(qwen2_src, "", "<|im_end|>");
    CHECK(q2.render(std::vector<chat_message>{{"user", "Hi"}}) ==
          "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
          "<|im_start|>assistant\n");
    CHECK(q2.render(sys_user) == t.render(sys_user));

    const auto q25 = chat_template::parse(qwen25_src, "", "<|im_end|>");
    CHECK(q25.render(std::vector<chat_message>{{"user", "Hi"}}) ==
          "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    CHECK(q25.render(sys_user) == t.render(sys_user));
}

TEST_CASE("mistral: [INST] without <<SYS>>; the system text joins the first user turn") {
    const auto v01 = chat_template::parse(mistral_v01_src, "<s>", "</s>");
    // bos, then '[INST] ' + user + ' [/INST]', then answer + eos (no spaces added)
    CHECK(v01.render(dialog) == "<s>[INST] Hi [/INST]Hello.</s>[INST] How are you? [/INST]");

    const auto v1 = chat_template::parse(mistral_v1_src, "<s>", "</s>");
    // ' [INST] ' + system + '\n\n' + user + ' [/INST]', then ' ' + answer + eos
    CHECK(v1.render(sys_dialog) == "<s> [INST] Be kind.\n\nHi [/INST] Hello.</s> [INST] How are you? [/INST]");
    CHECK(v1.render(dialog) == "<s> [INST] Hi [/INST] Hello.</s> [INST] How are you? [/INST]");
    const auto v3 = chat_template::parse(mistral_v3_src, "<s>", "</s>");
    // "[INST] " + user + "[/INST]", " " + trim(answer) + eos; the system text goes with the
    // last message when that is a user turn, and is dropped otherwise.
    CHECK(v3.render(sys_dialog) == "<s>[INST] Hi[/INST] Hello.</s>[INST] Be kind.\n\nHow are you?[/INST]");
    const std::vector<chat_message> ends_with_answer{{"system", "S"}, {"user", "Hi"}, {"assistant", " Yo "}};
    CHECK(v3.render(ends_with_answer, false) == "<s>[INST] Hi[/INST] Yo</s>");
    // The canonical form is the v1 one.
    CHECK(chat_template::of(chat_family::mistral).render(sys_dialog) == v1.render(sys_dialog));
}

TEST_CASE("zephyr: <|role|> lines closed by </s>") {
    const auto t = chat_template::parse(zephyr_src, "<s>", "</s>");
    // trim_blocks drops the newline after each {% %} tag; the one after each {{ }} stays.
    CHECK(t.render(sys_user) == "<|system|>\nYou are terse.</s>\n<|user|>\nHi there!</s>\n<|assistant|>\n");
    CHECK(t.render(dialog, false) == "<|user|>\nHi</s>\n<|assistant|>\nHello.</s>\n<|user|>\nHow are you?</s>\n");
}

TEST_CASE("gemma: 'model' role, trimmed content, system folded into the first user turn") {
    const auto t = chat_template::parse(gemma_src, "<bos>", "<eos>");
    CHECK(t.render(dialog) == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
                              "<start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n");
    CHECK(t.render(sys_user, false) == "<bos><start_of_turn>user\nYou are terse.\n\nHi there!<end_of_turn>\n");
}

TEST_CASE("phi-3: <|role|> lines closed by <|end|>; EOS when no generation prompt") {
    const auto t = chat_template::parse(phi3_src, "<s>", "<|endoftext|>");
    CHECK(t.render(sys_user) == "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi there!<|end|>\n<|assistant|>\n");
    CHECK(t.render(dialog, false) ==
          "<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n<|user|>\nHow are you?<|end|>\n<|endoftext|>");
}

TEST_CASE("plain fallback: documented User:/Assistant: lines") {
    const auto t = chat_template::parse(alpaca_src, "<s>", "</s>");
    CHECK(t.family() == chat_family::plain);
    CHECK(t.render(sys_dialog) == "<s>Be kind.\n\nUser: Hi\nAssistant: Hello.\nUser: How are you?\nAssistant:");
    CHECK(t.render(dialog, false) == "<s>User: Hi\nAssistant: Hello.\nUser: How are you?\n");
    CHECK(chat_template::of(chat_family::plain, "", "").render(std::vector<chat_message>{{"user", "x"}}) ==
          "User: x\nAssistant:");
    CHECK(t.stop_strings() == std::vector<std::string>{"\nUser:"});
}

TEST_CASE("every family ends its generation prompt where the answer starts, and has stop strings") {
    for (auto f : {chat_family::llama2, chat_family::llama3, chat_family::chatml, chat_family::mistral,
                   chat_family::zephyr, chat_family::gemma, chat_family::phi3, chat_family::plain}) {
        INFO(name_of(f));
        const auto t = chat_template::of(f);
        CHECK(t.family() == f);
        CHECK(!t.stop_strings().empty());
        const std::string with = t.render(sys_dialog, true), without = t.render(sys_dialog, false);
        if (f != chat_family::phi3) CHECK(with.starts_with(without)); // phi-3 closes with EOS instead
        CHECK(with.find("How are you?") != std::string::npos);
        CHECK(with.find("Be kind.") != std::string::npos);
        CHECK(t.render(std::vector<chat_message>{}, false).size() <= 4); // at most BOS or EOS
    }
}

TEST_CASE("from_gguf: stories260K has no template, so plain with its BOS text") {
    gguf::file f = gguf::file::open(test::model_path("stories260K.gguf"));
    tokenizer tok = tokenizer::from_gguf(f);
    const auto t = chat_template::from_gguf(f, tok);
    CHECK(t.family() == chat_family::plain);
    const std::string text = t.render(std::vector<chat_message>{{"user", "Once upon a time"}});
    CHECK(text == "<s>User: Once upon a time\nAssistant:");
    const auto ids = tok.encode(text, /*add_special=*/false, /*parse_special=*/true);
    REQUIRE(!ids.empty());
    CHECK(ids[0] == tok.bos());
}

TEST_CASE("from_gguf: the template and BOS/EOS texts come from the file's metadata") {
    gguf::file src = gguf::file::open(test::model_path("stories260K.gguf"));
    gguf::writer w;
    for (const auto& kv : src.metadata()) w.set(kv.key, kv.val);
    w.set_string("tokenizer.chat_template", mistral_v1_src);
    const std::vector<uint8_t> bytes = w.serialize();
    gguf::file f = gguf::file::parse(bytes, "with-template.gguf");
    tokenizer tok = tokenizer::from_gguf(f);
    const auto t = chat_template::from_gguf(f, tok);
    CHECK(t.family() == chat_family::mistral);
    CHECK(t.render(sys_dialog) == "<s> [INST] Be kind.\n\nHi [/INST] Hello.</s> [INST] How are you? [/INST]");
    // The rendered text encodes with its BOS/EOS texts as those tokens.
    const auto ids = tok.encode(t.render(dialog), /*add_special=*/false, /*parse_special=*/true);
    CHECK(ids.front() == tok.bos());
    CHECK(std::count(ids.begin(), ids.end(), tok.eos()) == 1);
}

TEST_CASE("tools: described where each family's template puts them; past calls and results in its form") {
    // The tool as a client sends it; its keys keep their order (as transformers' dicts do).
    const std::vector<std::string> tools{
        R"({"type": "function", "function": {"name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})"};
    const std::string tool_line = R"({"type": "function", "function": {"name": "get_weather", "description": )"
                                  R"("Weather now", "parameters": {"type": "object", "properties": {"city": {"type": )"
                                  R"("string"}}, "required": ["city"]}}})";
    const chat_message call{"assistant", "", {{"abcDEF123", "get_weather", R"({"city":"Paris"})"}}, {}};
    const chat_message result{"tool", "18 C", {}, "abcDEF123"};

    // Qwen 2.5: the tools after the (default) system text; consecutive results share a user turn.
    const auto q25 = chat_template::parse(qwen25_src, "", "<|im_end|>");
    const std::vector<chat_message> turns{{"user", "Weather in Paris?"}, call, result, result};
    CHECK(q25.render(turns, true, tools) ==
          "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
          "You may call one or more functions to assist with the user query.\n\nYou are provided with function "
          "signatures within <tools></tools> XML tags:\n<tools>\n" + tool_line +
              "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
              "<args-json-object>}\n</tool_call><|im_end|>\n"
              "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
              "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
              "</tool_call><|im_end|>\n"
              "<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\n18 C\n</tool_response>"
              "<|im_end|>\n<|im_start|>assistant\n");
    // Without tools offered, a history with calls still renders them.
    CHECK(q25.render(turns, true).find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\"") !=
          std::string::npos);

    // Llama 3.1: "Environment: ipython", the tools (indented JSON) in the first user turn, a
    // result through tojson.
    const auto t31 = chat_template::parse(llama31_src, "<|begin_of_text|>", "<|eot_id|>");
    const std::vector<chat_message> l3{{"system", "You are terse."}, {"user", "Weather in Paris?"}, call, result};
    CHECK(t31.render(l3, true, tools) ==
          "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
          "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are terse.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON "
          "for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the "
          "format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use "
          "variables.\n\n{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n"
          "        \"description\": \"Weather now\",\n        \"parameters\": {\n            \"type\": \"object\",\n"
          "            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\"\n"
          "                }\n            },\n            \"required\": [\n                \"city\"\n            ]\n"
          "        }\n    }\n}\n\nWeather in Paris?<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": "
          "\"Paris\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n\"18 C\"<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");

    // Mistral v3: [AVAILABLE_TOOLS] before the last user turn, calls with their ids, results.
    const auto v3 = chat_template::parse(mistral_v3_src, "<s>", "</s>");
    const std::vector<chat_message> mt{{"user", "Weather in Paris?"}, call, result, {"user", "Thanks"}};
    CHECK(v3.render(mt, true, tools) ==
          "<s>[INST] Weather in Paris?[/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": "
          "\"Paris\"}, \"id\": \"abcDEF123\"}]</s>[TOOL_RESULTS] {\"content\": 18 C, \"call_id\": \"abcDEF123\"}"
          "[/TOOL_RESULTS][AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
          "\"description\": \"Weather now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
          "{\"type\": \"string\"}}, \"required\": [\"city\"]}}}][/AVAILABLE_TOOLS][INST] Thanks[/INST]");

    // Families without a form of their own: the hermes text in the system turn.
    const auto plain = chat_template::of(chat_family::plain, "", "");
    CHECK(plain.render(turns, true, tools)
              .ends_with("User: Weather in Paris?\nAssistant: <tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                         "{\"city\": \"Paris\"}}\n</tool_call>\nUser: <tool_response>\n18 C\n</tool_response>\n"
                         "<tool_response>\n18 C\n</tool_response>\nAssistant:"));
    CHECK(plain.render(turns, true, tools).starts_with("# Tools\n\nYou may call one or more functions"));
}

// ---- the model's own template through the Jinja engine ----

TEST_CASE("jinja: the template renders the conversation as Jinja2 would, with calls, results and kwargs") {
    const std::string src =
        "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
        "{% if m.reasoning_content %}[think:{{ m.reasoning_content }}]{% endif %}"
        "{% for c in m.tool_calls | default([]) %}[call {{ c.function.name }} {{ c.function.arguments | tojson }} "
        "{{ c.function.arguments.city }}]{% endfor %}{% if m.role == 'tool' %}({{ m.name }}/{{ m.tool_call_id }}){% endif %}"
        "{{ eos_token }}{% endfor %}{% if tools %}[tools {{ tools | map(attribute='function.name') | join(',') }}]{% endif %}"
        "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
        "<think></think>{% endif %}{% endif %}";
    const auto t = chat_template::from_jinja(src, "<s>", "</s>");
    REQUIRE(t.uses_jinja());
    CHECK(t.renderer_name() == "jinja");
    std::vector<chat_message> msgs{{"user", "Weather?"}, {"assistant", "", {{"c1", "get_weather", "{\"city\": \"Paris\"}"}}},
                                   {"tool", "18 C", {}, "c1"}};
    msgs.push_back({"assistant", "Mild.", {}, {}, "it said 18"});
    const std::vector<std::string> tools{R"({"type": "function", "function": {"name": "get_weather"}})"};
    CHECK(t.render(msgs, true, tools) ==
          "<s><|user|>Weather?</s><|assistant|>[call get_weather {\"city\": \"Paris\"} Paris]</s>"
          "<|tool|>18 C(get_weather/c1)</s><|assistant|>Mild.[think:it said 18]</s>[tools get_weather]<|assistant|>");
    const nlohmann::ordered_json kwargs = {{"enable_thinking", false}};
    CHECK(t.render(std::vector<chat_message>{{"user", "Hi"}}, true, {}, &kwargs) ==
          "<s><|user|>Hi</s><|assistant|><think></think>");
    CHECK(t.render(std::vector<chat_message>{{"user", "Hi"}}, false) == "<s><|user|>Hi</s>");
}

TEST_CASE("jinja: a template that fails falls back to its family, and says why") {
    // refused at load: an unsupported tag; the family (chatml, from the markers) renders
    const auto bad = chat_template::from_jinja("{% include 'x' %}<|im_start|>", "", "<|im_end|>");
    CHECK_FALSE(bad.uses_jinja());
    CHECK(bad.renderer_name() == "family:chatml");
    CHECK(bad.jinja_error() == "unsupported tag 'include' (line 1)");
    CHECK(bad.render(std::vector<chat_message>{{"user", "Hi"}}) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    // failing for one conversation (raise_exception): that prompt comes from the family
    const auto strict = chat_template::from_jinja(
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n",
        "", "<|im_end|>");
    REQUIRE(strict.uses_jinja());
    CHECK_THROWS_WITH_AS(strict.render_jinja(std::vector<chat_message>{{"system", "S"}}, true, {}, nullptr),
                         "no system role (line 1)", jinja::error);
    CHECK(strict.render(std::vector<chat_message>{{"system", "S"}, {"user", "U"}}) ==
          "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
    // no template at all
    const auto none = chat_template::from_jinja("", "<s>", "</s>");
    CHECK_FALSE(none.uses_jinja());
    CHECK(none.renderer_name() == "family:plain");
}

TEST_CASE("jinja: the shared DeepSeek-R1 template gives its own turns, not the plain family's") {
    std::ifstream in(std::string(TANDEM_SHARED_DIR) + "/data/templates/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja");
    REQUIRE(in);
    std::stringstream ss;
    ss << in.rdbuf();
    const auto t = chat_template::from_jinja(ss.str(), "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
    REQUIRE(t.uses_jinja());
    CHECK(t.family() == chat_family::plain); // no family of its own: tool calls and stops stay generic
    const std::string text = t.render(std::vector<chat_message>{{"system", "Be brief."}, {"user", "Hi"}});
    CHECK(text == "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>\n");
}

TEST_CASE("jinja: a long conversation is not mistaken for a hostile template (the output limit grows with it)") {
    const auto t = chat_template::from_jinja("{% for m in messages %}[{{ m.content }}]{% endfor %}", "", "");
    const std::string big(6 << 20, 'x'); // past the engine's default 4 MiB
    const std::string text = t.render_jinja(std::vector<chat_message>{{"user", big}}, true, {}, nullptr);
    CHECK(text.size() == big.size() + 2);
}
