// Valid requests of every route, with every field the API documents, and the paths of the
// values in them: the wrong-type test (test_hostile) and the request fuzzer (fuzz_json_api)
// change one value at a time from these.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace tandem::test {

using json = nlohmann::json;


// Every place in `j`: its path as the API names it ("messages[2].tool_calls[0].id") and a
// pointer to the value there.
inline void paths_of(const json& j, const std::string& at, std::vector<std::pair<std::string, json::json_pointer>>& out,
              const json::json_pointer& ptr = json::json_pointer()) {
    if (j.is_object()) {
        for (const auto& [k, v] : j.items()) {
            const std::string p = at.empty() ? k : at + "." + k;
            out.emplace_back(p, ptr / k);
            paths_of(v, p, out, ptr / k);
        }
    } else if (j.is_array()) {
        for (size_t i = 0; i < j.size(); ++i) {
            const std::string p = at + "[" + std::to_string(i) + "]";
            out.emplace_back(p, ptr / i);
            paths_of(j[i], p, out, ptr / i);
        }
    }
}

// Whether `param` names `path` or a place that holds it ("messages[0]" holds
// "messages[0].content[1].type").
inline bool names(const std::string& param, const std::string& path) {
    if (param.empty() || !path.starts_with(param)) return false;
    return param.size() == path.size() || path[param.size()] == '.' || path[param.size()] == '[';
}

// Whether `param` names a place that `body` has (or one above it).
inline bool names_a_place(const std::string& param, const json& body) {
    if (param.empty()) return true;
    std::vector<std::pair<std::string, json::json_pointer>> paths;
    paths_of(body, "", paths);
    for (const auto& [path, ptr] : paths)
        if (names(param, path)) return true;
    return false;
}

struct base_request {
    std::string route;
    json body;
};

inline std::vector<base_request> base_requests() {
    const json tool = {{"type", "function"},
                       {"function",
                        {{"name", "get_weather"},
                         {"description", "the weather"},
                         {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}},
                         {"strict", false}}}};
    const json messages = json::array(
        {{{"role", "system"}, {"content", "Be brief."}},
         {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Hi"}}})}},
         {{"role", "assistant"},
          {"content", nullptr},
          {"tool_calls",
           json::array({{{"id", "call_1"},
                         {"type", "function"},
                         {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Oslo\"}"}}}}})}},
         {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}},
         {{"role", "user"}, {"content", "And tomorrow?"}}});
    json chat = {{"model", "stories260K"},   {"messages", messages},  {"max_tokens", 1},
                 {"temperature", 0.5},       {"top_p", 0.9},          {"top_k", 5},
                 {"min_p", 0.01},            {"n", 1},                {"best_of", 1},
                 {"stream", false},          {"stop", {"\n"}},        {"seed", 1},
                 {"presence_penalty", 0.1},  {"frequency_penalty", 0.1}, {"repetition_penalty", 1.1},
                 {"logit_bias", {{"5", 1}}}, {"logprobs", true},      {"top_logprobs", 2},
                 {"user", "u"},              {"ignore_eos", false},   {"priority", 0},
                 {"truncate_prompt_tokens", 200}, {"tools", {tool}}, {"tool_choice", "auto"},
                 {"parallel_tool_calls", true}, {"speculative", {{"method", "ngram"}, {"num_tokens", 1}}}};
    json chat_stream = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                        {"max_completion_tokens", 1},
                        {"stream", true},
                        {"stream_options", {{"include_usage", true}}},
                        {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                        {"tools", {tool}}};
    json schema = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                   {"max_tokens", 1},
                   {"response_format",
                    {{"type", "json_schema"},
                     {"json_schema",
                      {{"name", "x"},
                       {"strict", true},
                       {"description", "d"},
                       {"schema", {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}}}}}}}};
    json grounded = {{"messages", {{{"role", "user"}, {"content", "Who?"}}}},
                     {"max_tokens", 1},
                     {"documents", {{{"text", "Tim the cat."}, {"id", "d1"}, {"title", "T"}}}},
                     {"citation_options", {{"mode", "fast"}, {"min_tokens", 2}}}};
    json completion = {{"prompt", "Once"},           {"max_tokens", 1},   {"echo", true},
                       {"logprobs", 1},              {"structured_outputs", {{"regex", "[a-z]+"}}}};
    json beams = {{"prompt", {"Once", "Twice"}}, {"max_tokens", 1},        {"use_beam_search", true},
                  {"best_of", 2},                {"length_penalty", 1.0}, {"early_stopping", "never"}};
    json ids = {{"prompt", {{1, 2}, {3}}}, {"max_tokens", 1}, {"guided_choice", {"a", "b"}}};
    json embed = {{"input", {"a", "b"}}, {"encoding_format", "float"}, {"dimensions", 64},
                  {"user", "u"},         {"priority", 1},             {"truncate_prompt_tokens", 10}};
    json tokenize = {{"content", "hi"}, {"add_special", true}, {"parse_special", false}};
    json apply = {{"messages", messages}, {"tools", {tool}}, {"tool_choice", "auto"}, {"add_generation_prompt", true}};
    return {{"/v1/chat/completions", chat},     {"/v1/chat/completions", chat_stream},
            {"/v1/chat/completions", schema},   {"/v1/chat/completions", grounded},
            {"/v1/completions", completion},    {"/v1/completions", beams},
            {"/v1/completions", ids},           {"/v1/embeddings", embed},
            {"/tokenize", tokenize},            {"/detokenize", {{"tokens", {1, 2}}}},
            {"/v1/tandem/apply-template", apply}};
}

} // namespace tandem::test
