#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "api/http_responder.h"
#include "api/openai_run.h"
#include "api/stream_pump.h"
#include "common/tokenizer/tokenizer.h"

namespace loom::api {

class OpenAiAnswer;

/// The answers in progress, each owned here until it ends. Thread-safe.
class OpenAiAnswers {
 public:
  void Add(std::shared_ptr<OpenAiAnswer> answer);
  void Remove(const OpenAiAnswer* answer);
  /// Detaches every answer still open (and any added later): their requests are
  /// cancelled and nothing wakes them again.
  void DetachAll();

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<const OpenAiAnswer*, std::shared_ptr<OpenAiAnswer>> answers_
      ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

/// Answers one completion or chat request as its choices produce output, with no thread
/// waiting for it: a step runs on the pump when a choice's output queue has something
/// (its listener), when the client's connection finished a write or went away (the
/// responder's wakeup), or at a time (a flush interval's end, the next keep-alive). A
/// streaming request is answered with Server-Sent Events: one chunk per batch of new
/// text per choice (at most one write in flight: output that comes meanwhile joins the
/// next chunk), `: keep-alive` comments after 5 s of silence, the usage chunk and
/// `[DONE]` at the end; an error after streaming began is an error event. Otherwise one
/// JSON body once every choice finished. A client that goes away cancels every choice.
class OpenAiAnswer final : public StreamPump::Stream,
                           public std::enable_shared_from_this<OpenAiAnswer> {
 public:
  /// Answers `run` (its first samples placed) on `responder`; `answers` owns the answer
  /// until it ends. `tokenizer`, `pump` and `answers` outlive it.
  static void Start(std::shared_ptr<Run> run, bool chat, const common::Tokenizer& tokenizer,
                    StreamPump& pump, std::shared_ptr<HttpResponder> responder,
                    OpenAiAnswers& answers);

  void Pump() override;
  /// Ends the answer where it stands (the server is stopping): the choices are cancelled
  /// and nothing wakes it again.
  void Detach();

 private:
  OpenAiAnswer(std::shared_ptr<Run> run, bool chat, const common::Tokenizer& tokenizer,
               StreamPump& pump, std::shared_ptr<HttpResponder> responder, OpenAiAnswers& answers);

  // Takes what the choices produced; true when it took something and may take more now.
  bool Step();
  // A streamed event's chunks (false: stop, the client is gone or the choice failed).
  bool StreamEvent(Choice& choice, const engine::OutputEvent& event);
  Json ChunkBody(Json choices) const;     // a chunk's object (usage null when asked for)
  std::string Chunk(Json choices) const;  // ... as an event
  // The answer is over: its end goes out (`finished`: every choice finished; else the
  // client is gone or a streamed choice failed) and it lets go of everything.
  void End(bool finished);
  void Release();

  const std::shared_ptr<Run> run_;
  const bool chat_;
  const common::Tokenizer& tokenizer_;
  StreamPump& pump_;
  const std::shared_ptr<HttpResponder> responder_;
  OpenAiAnswers& answers_;

  absl::Mutex mu_;
  bool stepping_ ABSL_GUARDED_BY(mu_) = false;  // a thread is in Pump's loop
  bool again_ ABSL_GUARDED_BY(mu_) = false;     // woken meanwhile: one more step
  std::atomic<bool> detached_{false};
  // Below: touched only by the stepping thread.
  bool ended_ = false;
  absl::Time last_write_;
  absl::Time timer_at_ = absl::InfinitePast();  // the pending WakeAt's time
};

}  // namespace loom::api
