// The `tandem` tool's subcommand registry: each group of commands registers itself here.
#pragma once

#include "daemon/cli_args.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tandem { struct load_options; }

namespace tandem::cli {

// A registered subcommand and what runs when the user picked it. `run` returns the exit
// code; a thrown exception becomes "tandem: error: <what>" and exit code 1.
struct command {
    CLI::App* sub;
    std::function<int()> run;
};

using registry = std::vector<command>;

// run, tokenize, detokenize, synth: offline, no daemon needed.
void register_offline(CLI::App& app, registry& reg);

// quantize, perplexity, eval-drift: INT8 and model quality (cli_eval.cpp).
void register_eval(CLI::App& app, registry& reg);

// bench and its modes: speed, roofline, compute peak, memory (cli_bench.cpp).
void register_bench(CLI::App& app, registry& reg);

// A mode of `tandem bench` that adds its flags to the subcommand: `flag` selects it, `run`
// measures (printing JSON when `json` is set by then).
struct bench_mode {
    CLI::Option* flag;
    std::function<int()> run;
};
// --serve (cli_bench_serve.cpp): a running daemon under load.
bench_mode add_bench_serve(CLI::App* bench, const bool& json);
// --grammar (cli_bench_grammar.cpp): guided generation's compile and mask times on `model`'s
// vocabulary (the -m flag, read when it runs).
bench_mode add_bench_grammar(CLI::App* bench, const std::string& model, const bool& json);

// The daemon's client: bare `tandem "prompt"` (the main app's positional prompt; its entry
// has sub == &app and runs when no subcommand was given), `chat` and `status`.
void register_client(CLI::App& app, registry& reg);

// `batch`: a file of OpenAI Batch requests, in-process or by the daemon (cli_batch.cpp).
void register_batch(CLI::App& app, registry& reg);

// `embed`: embeddings of texts from the daemon, or offline with -m (cli_embed.cpp).
void register_embed(CLI::App& app, registry& reg);

// `info`: a GGUF's architecture, shapes, tensors, context, tokenizer and memory, from its
// metadata alone (cli_info.cpp).
void register_info(CLI::App& app, registry& reg);

// `pull`, `ls`, `rm`, `show`, `alias`: the model store (cli_models.cpp).
void register_models(CLI::App& app, registry& reg);
// `tandem info`'s report of the GGUF at `path` (cli_info.cpp): text, or with `json` one object
// {"manifest": manifest, "info": ...}.
void print_model_info(const std::string& path, bool json, const nlohmann::ordered_json& manifest);

// `guide compile|check|bench`: the constraint engine on its own (cli_guide.cpp).
void register_guide(CLI::App& app, registry& reg);

// Helpers shared by command groups.
// -m, else $TANDEM_MODEL, else an error; a name that is not a file resolves through the model store.
std::string resolve_model(const std::string& flag);
int default_threads();
std::string read_stdin();
void write_out(std::string_view s); // stdout, flushed at once so streams show token by token
// --stop's escapes, as a shell user types them: \n, \t, \r and \\ (any other \ stays as it is).
std::string unescape(std::string s);
// --weights auto|int8|f32 and --kv f32|f16|int8 into o (defined in cli_eval.cpp).
void add_precision_flags(CLI::App* sub, load_options& o);

} // namespace tandem::cli
