// What the batch suites share: input lines, completion bodies, and reading results back.
#pragma once

#include "daemon_client.hpp"

#include <map>
#include <string>
#include <vector>

namespace tandem::test {

inline json line(const std::string& id, const std::string& url, const json& body) {
    return {{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", body}};
}

inline json completion(const std::string& prompt, int max_tokens) {
    return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

// `n` greedy completions with distinct prompts, as JSONL.
inline std::string completions_file(int n, int max_tokens) {
    std::string s;
    for (int i = 0; i < n; ++i)
        s += line("req-" + std::to_string(i), "/v1/completions",
                  completion("Once upon a time " + std::to_string(i), max_tokens))
                 .dump() +
             "\n";
    return s;
}

// custom_id -> how many output lines carry it.
inline std::map<std::string, int> id_counts(const std::vector<json>& lines) {
    std::map<std::string, int> n;
    for (const json& l : lines)
        if (l["custom_id"].is_string()) ++n[l["custom_id"].get<std::string>()];
    return n;
}

// What a response body says, without its id, time and prefix-cache hits: the comparison of
// two answers.
inline json answer_of(json body) {
    body.erase("id");
    body.erase("created");
    if (body.contains("usage")) body["usage"].erase("prompt_tokens_details");
    return body;
}

} // namespace tandem::test
