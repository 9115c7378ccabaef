// tandemd's batch jobs, as the OpenAI API defines them: /v1/files (upload with purpose
// "batch", list, retrieve, content, delete) and /v1/batches (create, retrieve, list, cancel).
// Files and jobs live under the state directory, so a job survives a restart: its results
// are appended whole to partial output files, and a restarted daemon goes on from what they
// hold (daemon/batch_file.hpp done_set), so every custom_id is answered exactly once.
//
// One runner thread runs the jobs in order of creation. It sends a job's lines to the daemon's
// own socket (daemon/batch_run.hpp sender), so a line takes exactly the path of a live request,
// at background priority (-1) unless its body sets one: live requests go first.
//
// Layout of the state directory:
//   files/ID        a file's bytes         files/ID.json     its file object
//   batches/ID.json {"batch": the batch object, "final": the status it ends with once finalized}
//   batches/ID.output.jsonl, batches/ID.errors.jsonl   results while the job runs
#pragma once

#include "daemon/access.hpp"
#include "daemon/reply.hpp"
#include "runtime/json_limits.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace tandem::daemon {

// One part of a multipart/form-data body.
struct form_part {
    std::string name, filename, content_type;
    std::string_view data;
};
// The parts of `body` by the boundary in `content_type`; nullopt with `why` when it is not
// multipart/form-data or is malformed.
std::optional<std::vector<form_part>> parse_multipart(std::string_view content_type, std::string_view body,
                                                      std::string& why);

struct batch_settings {
    std::string dir;                  // the state directory
    std::string socket;               // the daemon's own socket, where the runner sends lines
    int64_t max_file_bytes = 0;
    int max_json_depth = default_max_json_depth; // request bodies, input lines, stored state
    int32_t max_files = 0;
    int concurrency = 1;              // a job's requests in flight
    double wait_s = 300;              // a line the daemon refuses as busy is retried this long
};

class batch_jobs {
public:
    // Makes the directories and reads what is there; throws tandem::error when it cannot.
    explicit batch_jobs(batch_settings s);
    // Stops the runner (a job in progress stays so, and goes on at the next start).
    ~batch_jobs();
    batch_jobs(const batch_jobs&) = delete;
    batch_jobs& operator=(const batch_jobs&) = delete;

    // Starts the runner thread.
    void start();
    // The runner takes no new line (lines in flight finish); the destructor joins it.
    void stop();

    // The routes' operations (daemon/routes.cpp). Files and batches belong to the principal
    // that made them (a batch's results to the batch's owner); another principal gets 404 for
    // them, as if they did not exist, and lists only its own. Root and the daemon's user see
    // every one. An unknown query parameter is a 400 that names it.
    using query_map = std::map<std::string, std::string>;
    reply list_files(const query_map& query, const principal& who);                  // GET /v1/files
    // POST /v1/files: the multipart body, or (body_file) where the session stored it as it came
    reply upload(std::string_view content_type, const std::string& body, const std::string& body_file,
                 const principal& who);
    reply file(const std::string& id, bool content, const query_map& query, const principal& who); // GET /v1/files/{id}[/content]
    reply remove_file(const std::string& id, const query_map& query, const principal& who);       // DELETE /v1/files/{id}
    reply list_batches(const query_map& query, const principal& who);               // GET /v1/batches
    reply create_batch(const std::string& body, const principal& who);               // POST /v1/batches
    reply batch(const std::string& id, bool cancel, const query_map& query, const principal& who); // GET /v1/batches/{id}, POST .../cancel
    // A fresh path in the state directory for an upload's body (files/upload-*.tmp: removed
    // at start if a crash left it).
    std::string new_upload_path() const;

private:
    reply upload(std::string_view content_type, std::string_view body, const principal& who);
    reply delete_file(const std::string& id);   // under mu_
    reply cancel_batch(const std::string& id);  // under mu_

    void remove_orphans();                        // at start: what a crash left half made
    void run();                                   // the runner thread
    // Runs job `id` until it ends or the daemon stops; true when lines were left (refused as
    // busy past the wait): it is run again shortly.
    bool run_job(const std::string& id);
    // Ends job `id` with `status` (completed, cancelled, expired, failed): its partial results
    // become files. Idempotent, so a restart during it finishes it. Under mu_.
    void finalize(const std::string& id, const std::string& status);
    void save_job(const std::string& id);         // under mu_
    std::string file_path(const std::string& id) const { return s_.dir + "/files/" + id; }
    std::string job_path(const std::string& id, std::string_view suffix) const {
        return s_.dir + "/batches/" + id + std::string(suffix);
    }

    batch_settings s_;
    std::mutex mu_;
    std::condition_variable cv_;
    struct stored_file {
        json object;                              // the API's file object (json: reply.hpp's, keys in order)
        std::string owner;                        // principal::owner; "" (stored before owners): root's
    };
    std::map<std::string, stored_file> files_;    // id -> the file
    // Writes a file's object and owner beside its bytes (files/ID.json) and keeps it.
    void save_file(const std::string& id, json object, const std::string& owner); // under mu_
    struct job {
        json batch;                               // the batch object
        std::string owner;                        // as stored_file::owner
        std::string final_status;                 // set once it is being finalized
        std::atomic<bool> cancel{false};
    };
    std::map<std::string, std::unique_ptr<job>> jobs_;
    std::string running_;                         // the job the runner works on
    std::atomic<bool> stop_{false};
    int lock_fd_ = -1;                            // flock: one daemon per state directory
    std::thread runner_;
};

} // namespace tandem::daemon
