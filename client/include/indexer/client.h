// Client library of indexerd (SPEC §6): a thin, synchronous C++ wrapper over
// the indexer.v1 gRPC service, plus helpers to build and read Tensor messages.
//
// Errors: every call returns absl::Status / absl::StatusOr. A gRPC status is
// carried over with its code and message unchanged (FromGrpcStatus), so
// callers branch on the codes SPEC §6 names (INVALID_ARGUMENT, NOT_FOUND,
// FAILED_PRECONDITION, RESOURCE_EXHAUSTED, UNAVAILABLE, ...).
//
// Thread safety: IndexerClient is thread-safe; any number of threads may call
// it concurrently (gRPC stubs are). A StepSession is NOT thread-safe: one
// thread at a time drives it. Independent StepSessions (over disjoint
// sequences, SPEC §6) may run concurrently on different threads.
//
// Lifetimes: a StepSession holds its own reference to the channel, so it may
// outlive the IndexerClient that opened it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "indexer/v1/indexer.grpc.pb.h"
#include "indexer/v1/indexer.pb.h"

namespace indexer::client {

namespace v1 = ::indexer::v1;

// The one conversion of a gRPC status: code and message preserved, and the
// status details the daemon sends (a serialized google.rpc.Status, e.g.
// with a google.rpc.BadRequest naming the field) kept as the payload
// kStatusDetailsUrl.
inline constexpr char kStatusDetailsUrl[] = "type.googleapis.com/google.rpc.Status";
absl::Status FromGrpcStatus(const grpc::Status& status);

struct TlsOptions {
  // PEM roots that verify the daemon's certificate; empty: the system's.
  std::string ca_file;
  // This client's certificate chain and key (PEM), for mutual TLS.
  std::string cert_file;
  std::string key_file;
  // Name checked against the daemon's certificate instead of the address's
  // host (e.g. "localhost" when dialing 127.0.0.1 with a DNS-only SAN).
  std::string server_name;
};

struct ClientOptions {
  // Largest message sent or received. Replies of large prefill steps are
  // [rows, topk] int32 and easily exceed gRPC's 4 MiB default.
  int64_t max_message_bytes = int64_t{1} << 30;
  // Connect() waits this long for the channel to become ready; zero or
  // negative: do not wait (the first call then reports UNAVAILABLE).
  absl::Duration connect_timeout = absl::Seconds(5);
  // Deadline of each unary call; InfiniteDuration() = none.
  absl::Duration rpc_timeout = absl::Seconds(300);
  // Deadline of a whole Step stream; InfiniteDuration() = none.
  absl::Duration step_timeout = absl::InfiniteDuration();
  // StepSession::Abort waits this long for the daemon to end the step before
  // it cancels the stream outright.
  absl::Duration abort_grace = absl::Seconds(5);
  // A Step stream's calls poll for the daemon's answer this long before
  // they block (zero: block at once). A layer's reply comes one server
  // round trip later; polling spends the waiting thread's core on it and
  // saves the wake-up of a blocked thread.
  absl::Duration busy_poll = absl::ZeroDuration();
  // Explicit channel credentials; null: `tls` when set, else plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // TLS to the daemon (SPEC §9); used when `credentials` is null.
  std::optional<TlsOptions> tls;
  // Sent as metadata `client_id_header` on every call. A daemon on a
  // plaintext (or server-only TLS) listener namespaces this client's
  // sequences by it; under mutual TLS the certificate's SAN names the
  // client instead. Empty: not sent (the shared anonymous namespace).
  // Printable ASCII; the header a lower-case metadata key (Connect checks).
  std::string client_id;
  std::string client_id_header = "x-indexer-client";
  // More metadata sent on every call, e.g. `traceparent` (W3C trace
  // context) and `x-request-id`, which the daemon writes into its per-call
  // log line. Keys as for client_id_header, values printable ASCII.
  std::vector<std::pair<std::string, std::string>> metadata;
};

// Channel credentials for `tls`: INVALID_ARGUMENT naming the option when a
// file cannot be read or only one of cert_file / key_file is set.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeTlsCredentials(
    const TlsOptions& tls);

// One open Step stream (header sent, not yet committed or aborted), driven
// synchronously: each RunLayer writes one LayerRequest and blocks for its
// LayerReply. Errors the daemon finds in the header (unknown sequence, a
// sequence in another step, no pages) surface at the first RunLayer.
//
// Once any call fails, the stream is finished: the step was rolled back by
// the daemon (SPEC §6) and every further call returns FAILED_PRECONDITION.
// The destructor aborts a step that was neither committed nor aborted.
//
// Thread safety: not thread-safe; see the file comment.
class StepSession {
 public:
  ~StepSession();
  StepSession(const StepSession&) = delete;
  StepSession& operator=(const StepSession&) = delete;

  // Sends one layer of the step and waits for its top-k. Pass the request by
  // std::move to avoid copying large Q / K tensors. A reply naming another
  // layer than the request is reported as INTERNAL and aborts the step.
  absl::StatusOr<v1::LayerReply> RunLayer(v1::LayerRequest request);

  // Commits the step (every layer of the profile must have been run) and
  // returns the sequence lengths after it. The session is finished afterwards.
  absl::StatusOr<v1::StepCommitted> Commit();

  // Ends the step without committing: half-closes the stream and waits for
  // the daemon's final status, so that the sequences are free again when it
  // returns (given a daemon that rolls back before it answers). Cancels the
  // stream if the daemon has not answered within ClientOptions::abort_grace.
  // Idempotent; a no-op on a finished session.
  void Abort();

  // True once committed, aborted or failed.
  bool finished() const { return finished_; }

 private:
  friend class IndexerClient;
  // The Step stream as a generic (raw bytes) call driven from the calling
  // thread through the session's own completion queue: a layer's request is
  // sent with its tensors as slices of their own (no serialization copy)
  // and its reply is read while the request is still being written.
  using Call = grpc::GenericClientAsyncReaderWriter;

  StepSession(std::shared_ptr<grpc::Channel> channel,
              std::unique_ptr<grpc::ClientContext> context,
              absl::Duration abort_grace, absl::Duration busy_poll);

  // Starts the call; false when it could not be started.
  bool Start();
  // Waits for the completion of operation `tag`; false when it failed. With
  // a finite `deadline`, cancels the call once when the deadline passes and
  // then waits for the completion all the same.
  bool Await(void* tag, absl::Time deadline = absl::InfiniteFuture());
  bool WriteMessage(const grpc::ByteBuffer& bytes,
                    absl::Time deadline = absl::InfiniteFuture());
  bool ReadMessage(grpc::ByteBuffer* bytes,
                   absl::Time deadline = absl::InfiniteFuture());
  bool WritesDone(absl::Time deadline = absl::InfiniteFuture());
  // Reads until the stream ends, then takes the call's final status.
  grpc::Status DrainAndFinish(absl::Time deadline = absl::InfiniteFuture());

  // Cancels at once (the daemon broke the protocol) and ends the stream.
  void Cancel();

  // Ends a broken stream and returns why it broke; `what` names the failed
  // operation when the daemon's status is OK (the stream ended early).
  absl::Status FailStream(const char* what);
  absl::Status CheckOpen() const;

  std::shared_ptr<grpc::Channel> channel_;  // keeps the channel alive
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::CompletionQueue> cq_;
  std::unique_ptr<Call> call_;
  absl::Duration abort_grace_;
  absl::Duration busy_poll_;
  static constexpr int kOps = 5;  // start, write, read, writes done, finish
  bool done_[kOps] = {};  // completed and not yet awaited, per operation
  bool ok_[kOps] = {};
  bool cancelled_ = false;
  bool writes_done_ = false;  // half-closed: WritesDone may be called once
  bool finished_ = false;
};

class IndexerClient {
 public:
  // Opens a channel to `address` ("host:port", "unix:/path") and, unless
  // options.connect_timeout <= 0, waits until it is ready (UNAVAILABLE
  // naming the address otherwise).
  static absl::StatusOr<std::unique_ptr<IndexerClient>> Connect(
      const std::string& address, const ClientOptions& options = {});

  IndexerClient(const IndexerClient&) = delete;
  IndexerClient& operator=(const IndexerClient&) = delete;

  absl::StatusOr<v1::ServerInfo> GetServerInfo();
  // Drops sequences; returns the pages released, summed over groups.
  absl::StatusOr<uint64_t> Release(const std::vector<v1::SequenceId>& ids);
  // Bulk import; returns the sequence length after the write.
  absl::StatusOr<uint64_t> WriteEntries(const v1::WriteEntriesRequest& request);
  // Opens a Step stream and sends `header`.
  absl::StatusOr<std::unique_ptr<StepSession>> OpenStep(
      const v1::StepHeader& header);

  // Lifecycle. One page of this client's own sequences (its namespace).
  absl::StatusOr<v1::ListSequencesResponse> ListSequences(uint32_t page_size = 0,
                                                          const std::string& page_token = "");
  // A sequence's entries, every layer, as the WriteEntriesRequest messages
  // that recreate it (the first with create set): `on_message` takes each
  // in order as it arrives; an error it returns cancels the export and is
  // returned. Sending them to another daemon of the same profile with
  // WriteEntries hands the sequence over (CopySequence).
  absl::Status ExportEntries(const v1::ExportEntriesRequest& request,
                             const std::function<absl::Status(v1::WriteEntriesRequest&)>& on_message);
  // Exports `id` from this daemon and imports it into `to`, message by
  // message (one in memory at a time); returns the length imported. On an
  // error midway `to` holds a prefix of the sequence (each import is
  // atomic): release it there before a retry.
  absl::StatusOr<uint64_t> CopySequence(const v1::SequenceId& id, IndexerClient& to,
                                        uint64_t max_message_bytes = 0);

  // Regions (the data plane): memory shared with the daemon so that tensors
  // travel as references (MakeRefTensor, LayerRequest.topk_out). A region
  // belongs to this client's identity (ClientOptions::metadata) and is
  // dropped after RegisterRegionResponse.lease_ms without use.
  // A POSIX shared-memory object on the daemon's host; `offset` a multiple
  // of the page size.
  absl::StatusOr<v1::RegisterRegionResponse> RegisterHostRegion(
      const std::string& name, const std::string& shm_name, uint64_t offset, uint64_t bytes);
  // A memfd of this process (e.g. MemfdRegion::fd()) as a host region: the
  // descriptor goes over the daemon's memfd socket (`socket_path`; "" = the
  // one ServerInfo.memfd_socket names, FAILED_PRECONDITION when the daemon
  // has none) and the token it answers is registered at once. The daemon
  // must run on this host; it seals the memfd against shrinking.
  absl::StatusOr<v1::RegisterRegionResponse> RegisterMemfdRegion(
      const std::string& name, int fd, uint64_t offset, uint64_t bytes,
      const std::string& socket_path = "");
  // The second half of RegisterMemfdRegion: the host form by a token that
  // SendMemfd returned.
  absl::StatusOr<v1::RegisterRegionResponse> RegisterMemfdToken(const std::string& name,
                                                                const std::string& token,
                                                                uint64_t offset, uint64_t bytes);
  // GPU memory exported with cudaIpcGetMemHandle / hipIpcGetMemHandle:
  // `ipc_handle` its bytes, the device named by its UUID ("GPU-...") or,
  // when that is empty, its PCI bus id.
  absl::StatusOr<v1::RegisterRegionResponse> RegisterDeviceRegion(
      const std::string& name, const std::string& ipc_handle, const std::string& device_uuid,
      const std::string& pci_bus_id, uint64_t offset, uint64_t bytes);
  absl::Status UnregisterRegion(uint64_t region);
  absl::StatusOr<std::vector<v1::RegionInfo>> ListRegions();
  // Request rings (feature "host_ring"; RingChannel in indexer/ring_channel.h
  // builds one): the ring at `offset` of this client's host region.
  absl::StatusOr<v1::AttachRingResponse> AttachRing(uint64_t region, uint64_t offset);
  // Returns whether an open step on the ring was rolled back.
  absl::StatusOr<bool> DetachRing(uint64_t ring);

  const std::string& address() const { return address_; }
  const ClientOptions& options() const { return options_; }

 private:
  IndexerClient(std::string address, ClientOptions options,
                std::shared_ptr<grpc::Channel> channel);
  // Deadline (unless infinite) and the client id header.
  void Prepare(grpc::ClientContext& context, absl::Duration timeout) const;

  std::string address_;
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Indexer::Stub> stub_;
};

// ----------------------------------------------------------------- helpers --

// Anonymous shared memory for host regions: a memfd (memfd_create with
// MFD_CLOEXEC | MFD_ALLOW_SEALING) of `bytes`, mapped read-write. Nothing to
// unlink: the memory goes when this process and the daemon have both let go
// (the daemon when the region is unregistered or its lease ends). Move-only;
// the destructor unmaps and closes.
class MemfdRegion {
 public:
  // `name` shows in /proc/<pid>/maps and the daemon's ListRegions ("memfd:name").
  static absl::StatusOr<MemfdRegion> Create(const std::string& name, size_t bytes);
  MemfdRegion() = default;
  MemfdRegion(MemfdRegion&& o) noexcept;
  MemfdRegion& operator=(MemfdRegion&& o) noexcept;
  MemfdRegion(const MemfdRegion&) = delete;
  MemfdRegion& operator=(const MemfdRegion&) = delete;
  ~MemfdRegion();

  int fd() const { return fd_; }
  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  void Reset();
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

// Passes `fd` over the daemon's memfd socket at `socket_path` (the wire in
// indexer.proto, HostRegion) and returns the token it answered: single-use,
// valid for the daemon's memfd_token_ttl_ms. The daemon's refusals come
// back as INVALID_ARGUMENT (RESOURCE_EXHAUSTED for its limits) with its text.
absl::StatusOr<std::string> SendMemfd(const std::string& socket_path, int fd);

// Process-wide glibc malloc settings for large messages (the ones indexerd
// uses): allocations up to 32 MiB stay off mmap and up to 64 MiB of freed
// memory per malloc arena is kept, so the ~0.5 MB tensors of every layer do
// not fault in fresh pages on each round trip; at most 4 malloc arenas
// (unless MALLOC_ARENA_MAX is set), so that what the arenas keep stays
// bounded. Optional; call once, early in main(), before other threads
// allocate. false when glibc refused a value.
bool TuneProcessAllocator();

v1::SequenceId NumericSequenceId(uint64_t num);
v1::SequenceId NamedSequenceId(const std::string& name);
// "42" or "\"name\"", for messages.
std::string SequenceIdString(const v1::SequenceId& id);

// Bytes of one element of `dtype`; 0 for DATA_TYPE_UNSPECIFIED / unknown.
int64_t DataTypeSize(v1::DataType dtype);
// Product of `shape` (1 for a scalar); -1 when a dimension is negative.
int64_t NumElements(absl::Span<const int64_t> shape);

// Builds a Tensor from little-endian element data. REQUIRES: `bytes` equals
// NumElements(shape) * DataTypeSize(dtype).
v1::Tensor MakeTensor(v1::DataType dtype, absl::Span<const int64_t> shape,
                      const void* data, size_t bytes);
// Typed forms; REQUIRES: values.size() == NumElements(shape).
v1::Tensor MakeFp32Tensor(absl::Span<const float> values,
                          absl::Span<const int64_t> shape);
v1::Tensor MakeInt32Tensor(absl::Span<const int32_t> values,
                           absl::Span<const int64_t> shape);
// `dtype` is UINT8 or FP8_E4M3 (both one byte per element).
v1::Tensor MakeByteTensor(v1::DataType dtype, absl::Span<const uint8_t> values,
                          absl::Span<const int64_t> shape);

// A Tensor whose bytes are [offset, offset + NumElements(shape) x
// DataTypeSize(dtype)) of registered region `region`. The caller writes them
// before sending the request that carries it (the ordering contract).
v1::Tensor MakeRefTensor(v1::DataType dtype, absl::Span<const int64_t> shape,
                         uint64_t region, uint64_t offset);
// A reference to `bytes` bytes at `offset` of `region`, e.g. topk_out.
v1::TensorRef MakeTensorRef(uint64_t region, uint64_t offset, uint64_t bytes);

// Reads an INT32 tensor. Checks the dtype, that the byte count matches the
// shape and, when `expected_shape` is not empty, the shape itself; the error
// names `field` and the expected value.
absl::StatusOr<std::vector<int32_t>> ReadInt32Tensor(
    const v1::Tensor& tensor, absl::Span<const int64_t> expected_shape = {},
    const std::string& field = "tensor");

}  // namespace indexer::client
