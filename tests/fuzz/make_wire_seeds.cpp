// Writes fuzz_wire's seeds into DIR: one valid message of each kind, its decoder byte first.
#include "ipc/wire.hpp"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: make_wire_seeds DIR\n");
        return 2;
    }
    const std::string dir = argv[1];
    auto write = [&](const char* name, uint8_t kind, const std::vector<uint8_t>& payload) {
        std::ofstream f(dir + "/" + name, std::ios::binary);
        f.put(char(kind));
        f.write(reinterpret_cast<const char*>(payload.data()), std::streamsize(payload.size()));
    };
    std::vector<uint8_t> b;
    tandem::ipc::encode(tandem::ipc::hello_msg{1234, 2, 0xfeedbeefull, "cpu (avx512_vnni, 2 threads)"}, b);
    write("hello", 0, b);
    tandem::ipc::run_msg run;
    run.batch_id = 7;
    const std::vector<int32_t> prompt{1, 2, 3, 4, 5}, table{3, 9}, one{42}, table2{tandem::no_page, 5};
    const std::vector<uint32_t> gens{1, 2}, gens2{0, 4};
    run.b.add_seq(1, 0, prompt, table, gens, 4);
    run.b.add_seq(2, 17, one, table2, gens2, 17);
    b.clear();
    tandem::ipc::encode(run, b);
    write("run", 1, b);
    tandem::ipc::done_msg done;
    done.batch_id = 7;
    done.ok = false;
    done.error = "worker: a page outside the pool";
    done.compute_s = 0.25;
    b.clear();
    tandem::ipc::encode(done, b);
    write("done", 2, b);
    return 0;
}
