// The offline loop's output on stories260K (runtime/generate.hpp, greedy or beams): what the
// daemon, its workers and the engine must reproduce. One model and one thread pool per test
// program.
#pragma once

#include "cpu/thread_pool.hpp"
#include "runtime/generate.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <string>

namespace tandem::test {

inline generate_result offline_run(const std::string& prompt, int n, bool ignore_eos, int beams = 0) {
    static model_bundle b = load_model(model_path("stories260K.gguf"));
    static cpu::thread_pool pool(1);
    generate_params p;
    p.request.max_tokens = n;
    p.request.sampling.temperature = 0;
    p.request.ignore_eos = ignore_eos;
    p.request.beam.width = beams;
    p.request.n = std::max(beams, 1);
    return generate(exec_ctx{backend::cpu, &pool}, *b.mdl, *b.tok, b.tok->encode(prompt, true, false), p);
}

} // namespace tandem::test
