// Writes fuzz_http's seeds of hostile requests: for every route of tests/api_requests.hpp, the
// valid request, and each of its fields given a value of another type and nested deeper than
// max_json_depth, framed as fuzz_http reads an odd first byte (the route's index in its target
// table, POST, HTTP/1.1, sent once).
// usage: make_api_seeds DIR
#include "tests/api_requests.hpp"

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: make_api_seeds DIR\n");
        return 2;
    }
    using tandem::test::json;
    // fuzz_http's framed targets: their index is the second byte.
    const std::map<std::string, char> route_byte = {{"/v1/chat/completions", 0}, {"/v1/completions", 1},
                                                    {"/v1/embeddings", 2},       {"/tokenize", 3},
                                                    {"/detokenize", 4},          {"/v1/tandem/apply-template", 5}};
    const std::string dir = argv[1];
    int n = 0;
    const auto write = [&](char route, const std::string& body) {
        std::ofstream(dir + "/api-" + std::to_string(n++), std::ios::binary) << '\x01' << route << body;
    };
    const json wrong[] = {"x", 7, json::array(), json::object()};
    for (const auto& base : tandem::test::base_requests()) {
        const char route = route_byte.at(base.route);
        write(route, base.body.dump());
        std::vector<std::pair<std::string, json::json_pointer>> paths;
        tandem::test::paths_of(base.body, "", paths);
        for (size_t i = 0; i < paths.size(); ++i) {
            json body = base.body;
            json& at = body.at(paths[i].second);
            const json w = wrong[i % 4].type() == at.type() ? wrong[(i + 1) % 4] : wrong[i % 4];
            json deep = at;
            at = w;
            write(route, body.dump());
            for (int d = 0; d < 80; ++d) deep = json::array({std::move(deep)});
            body.at(paths[i].second) = std::move(deep);
            write(route, body.dump());
        }
    }
    std::ofstream(dir + "/written") << n << "\n";
    return 0;
}
