// Loading a model for inference: the mapped file, its tokenizer and the engine model, or the
// metadata alone (a supervisor of workers), or a draft model checked against its target.
#pragma once

#include "runtime/model.hpp"
#include "runtime/tokenizer.hpp"

#include <memory>
#include <string>

namespace tandem {

namespace gguf { class file; }

// A model file opened for inference: the mapping, its tokenizer and the engine model.
struct model_bundle {
    std::unique_ptr<gguf::file> file;
    std::unique_ptr<tokenizer> tok;
    model_config cfg;
    std::unique_ptr<model> mdl;       // null from open_model_metadata
    double load_s = 0;
};

// How to hold a model in memory. The defaults are the engine's: INT8 weights (quantized at
// load unless the file is pre-quantized by `tandem quantize`), F16 KV cache.
struct load_options {
    weight_format weights = weight_format::native; // `--weights auto`: low-bit files keep their bits
    kv_dtype kv = kv_dtype::f16;
    int n_threads = 0; // threads that quantize at load; 0: every core
    int fd = -1;       // an open descriptor of the file to read instead of opening the path (a
                       // worker reads the file its supervisor opened, even once replaced on disk)
    bool cpu_layout = true; // INT8 matrices in the layout this CPU's kernels read (cpu::matmul_i8_layout);
                            // false: rows, as a GPU worker uploads them
};

// Throws tandem::error with one line naming the file and the problem.
model_bundle load_model(const std::string& path);
model_bundle load_model(const std::string& path, const load_options& opt);
// The file, its config and tokenizer, without weights: what the supervisor of worker
// processes needs. Cheap (the file is mapped, not read).
// With `fd`, reads the file that descriptor has open (load_options::fd).
model_bundle open_model_metadata(const std::string& path, int fd = -1);
// A draft model for speculative decoding: load_model, and tandem::error unless its vocabulary
// is the target's token for token ("draft model PATH cannot draft for the model: token 17
// is ...").
model_bundle load_draft_model(const std::string& path, const tokenizer& target, const load_options& opt);

} // namespace tandem
