#include "indexer/client.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/request_wire.h"
#include "kernels/common/status_macros.h"
#include "proto/transport_tuning.h"

namespace indexer::client {

// Tensors on the wire are little-endian (SPEC §3); element data is memcpy'd.
static_assert(std::endian::native == std::endian::little,
              "the client copies tensor bytes as-is: little-endian hosts only");

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // grpc::StatusCode and absl::StatusCode share the canonical numbering.
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  if (!status.error_details().empty()) {
    out.SetPayload(kStatusDetailsUrl, absl::Cord(status.error_details()));
  }
  return out;
}

namespace {

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout) {
  return std::chrono::system_clock::now() +
         absl::ToChronoMilliseconds(std::max(timeout, absl::ZeroDuration()));
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

// ------------------------------------------------------------ StepSession --

namespace {

// Operations of a Step call; their tags on the session's completion queue.
enum Op : intptr_t { kStart = 0, kWrite, kRead, kWritesDone, kFinish };

void* TagOf(Op op) { return reinterpret_cast<void*>(static_cast<intptr_t>(op)); }

bool SerializeStepRequest(const v1::StepRequest& message, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  return grpc::SerializationTraits<v1::StepRequest>::Serialize(message, out, &own_buffer)
      .ok();
}

bool ParseStepResponse(grpc::ByteBuffer* bytes, v1::StepResponse* response) {
  return grpc::SerializationTraits<v1::StepResponse>::Deserialize(bytes, response)
      .ok();
}

}  // namespace

StepSession::StepSession(std::shared_ptr<grpc::Channel> channel,
                         std::unique_ptr<grpc::ClientContext> context,
                         absl::Duration abort_grace, absl::Duration busy_poll)
    : channel_(std::move(channel)),
      context_(std::move(context)),
      cq_(std::make_unique<grpc::CompletionQueue>()),
      abort_grace_(abort_grace),
      busy_poll_(busy_poll) {}

StepSession::~StepSession() {
  if (!finished_) Abort();
  // Every operation was awaited; the queue has nothing left but shutdown.
  cq_->Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq_->Next(&tag, &ok)) {
  }
}

bool StepSession::Start() {
  grpc::GenericStub stub(channel_);
  call_ = stub.PrepareCall(context_.get(),
                           absl::StrCat("/", v1::Indexer::service_full_name(), "/Step"),
                           cq_.get());
  if (call_ == nullptr) return false;
  call_->StartCall(TagOf(kStart));
  return Await(TagOf(kStart));
}

bool StepSession::Await(void* tag, absl::Time deadline) {
  // At most one operation of each kind is in flight; completions of others
  // (the read of a layer finishing before its write) are kept until awaited.
  // Polling first (busy_poll): AsyncNext with a past deadline drives the
  // queue's polling on this thread without sleeping.
  const absl::Time poll_until =
      busy_poll_ > absl::ZeroDuration() ? absl::Now() + busy_poll_ : absl::InfinitePast();
  while (!done_[reinterpret_cast<intptr_t>(tag)]) {
    void* got = nullptr;
    bool ok = false;
    if (!cancelled_ && absl::Now() < poll_until && absl::Now() < deadline) {
      const auto r = cq_->AsyncNext(&got, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
      if (r == grpc::CompletionQueue::SHUTDOWN) return false;
      if (r == grpc::CompletionQueue::TIMEOUT) continue;
    } else if (deadline == absl::InfiniteFuture() || cancelled_) {
      if (!cq_->Next(&got, &ok)) return false;  // not reached: shut down last
    } else {
      switch (cq_->AsyncNext(&got, &ok, absl::ToChronoTime(deadline))) {
        case grpc::CompletionQueue::TIMEOUT:
          context_->TryCancel();  // every operation then completes
          cancelled_ = true;
          continue;
        case grpc::CompletionQueue::SHUTDOWN:
          return false;
        case grpc::CompletionQueue::GOT_EVENT:
          break;
      }
    }
    const intptr_t op = reinterpret_cast<intptr_t>(got);
    done_[op] = true;
    ok_[op] = ok;
  }
  const intptr_t op = reinterpret_cast<intptr_t>(tag);
  done_[op] = false;
  return ok_[op];
}

bool StepSession::WriteMessage(const grpc::ByteBuffer& bytes, absl::Time deadline) {
  call_->Write(bytes, TagOf(kWrite));
  return Await(TagOf(kWrite), deadline);
}

bool StepSession::ReadMessage(grpc::ByteBuffer* bytes, absl::Time deadline) {
  call_->Read(bytes, TagOf(kRead));
  return Await(TagOf(kRead), deadline);
}

bool StepSession::WritesDone(absl::Time deadline) {
  call_->WritesDone(TagOf(kWritesDone));
  return Await(TagOf(kWritesDone), deadline);
}

grpc::Status StepSession::DrainAndFinish(absl::Time deadline) {
  grpc::ByteBuffer ignored;
  while (ReadMessage(&ignored, deadline)) {
  }
  grpc::Status status;
  call_->Finish(&status, TagOf(kFinish));
  Await(TagOf(kFinish), deadline);
  return status;
}

absl::Status StepSession::CheckOpen() const {
  if (finished_) {
    return absl::FailedPreconditionError(
        "step session: the step is already committed, aborted or failed");
  }
  return absl::OkStatus();
}

absl::Status StepSession::FailStream(const char* what) {
  finished_ = true;
  if (call_ == nullptr) {
    return absl::InternalError(
        absl::StrCat("could not create the step stream while ", what));
  }
  // The daemon ended the stream (a failed Write or Read means it is closed):
  // drain it and take the daemon's status, which names the bad field.
  if (!writes_done_) {
    writes_done_ = true;
    WritesDone();
  }
  absl::Status status = FromGrpcStatus(DrainAndFinish());
  if (status.ok()) {
    return absl::InternalError(
        absl::StrCat("step stream ended early while ", what));
  }
  return status;
}

absl::StatusOr<v1::LayerReply> StepSession::RunLayer(
    v1::LayerRequest request) {
  RETURN_IF_ERROR(CheckOpen());
  const uint32_t layer = request.layer();
  grpc::ByteBuffer bytes;
  if (!EncodeLayerStepRequest(&request, &bytes)) {
    v1::StepRequest message;
    *message.mutable_layer() = std::move(request);
    if (!SerializeStepRequest(message, &bytes)) {
      Cancel();
      return absl::InternalError(
          absl::StrCat("layer ", layer, ": could not serialize the request"));
    }
  }
  // The reply is read while the request is written (as grpc_echo_bench
  // does); both complete before anything else happens on the stream.
  grpc::ByteBuffer reply_bytes;
  call_->Write(bytes, TagOf(kWrite));
  call_->Read(&reply_bytes, TagOf(kRead));
  const bool wrote = Await(TagOf(kWrite));
  const bool read = Await(TagOf(kRead));
  if (!wrote) return FailStream(absl::StrCat("sending layer ", layer).c_str());
  if (!read) {
    return FailStream(absl::StrCat("waiting for layer ", layer).c_str());
  }
  v1::StepResponse response;
  if (!ParseStepResponse(&reply_bytes, &response)) {
    Cancel();
    return absl::InternalError(absl::StrCat(
        "step stream: the reply of layer ", layer, " is not a StepResponse"));
  }
  if (!response.has_layer() || response.layer().layer() != layer) {
    Cancel();
    return absl::InternalError(absl::StrCat(
        "step stream: expected the reply of layer ", layer, ", got ",
        response.has_layer()
            ? absl::StrCat("the reply of layer ", response.layer().layer())
            : std::string("a StepCommitted")));
  }
  return std::move(*response.mutable_layer());
}

absl::StatusOr<v1::StepCommitted> StepSession::Commit() {
  RETURN_IF_ERROR(CheckOpen());
  v1::StepRequest message;
  message.mutable_commit();
  grpc::ByteBuffer bytes;
  if (!SerializeStepRequest(message, &bytes)) {
    Cancel();
    return absl::InternalError("could not serialize the commit");
  }
  if (!WriteMessage(bytes)) return FailStream("sending the commit");
  writes_done_ = true;
  if (!WritesDone()) return FailStream("sending the commit");
  grpc::ByteBuffer reply_bytes;
  if (!ReadMessage(&reply_bytes)) return FailStream("waiting for the commit");
  v1::StepResponse response;
  if (!ParseStepResponse(&reply_bytes, &response)) {
    Cancel();
    return absl::InternalError(
        "step stream: the reply to the commit is not a StepResponse");
  }
  if (!response.has_committed()) {
    Cancel();
    return absl::InternalError(absl::StrCat(
        "step stream: expected StepCommitted, got the reply of layer ",
        response.layer().layer()));
  }
  finished_ = true;
  RETURN_IF_ERROR(FromGrpcStatus(DrainAndFinish()));
  return std::move(*response.mutable_committed());
}

void StepSession::Abort() {
  if (finished_) return;
  finished_ = true;
  if (call_ == nullptr) return;
  // The daemon answers a half-close without commit by rolling the step back
  // and ending the stream; past abort_grace the call is cancelled (Await).
  const absl::Time deadline = absl::Now() + abort_grace_;
  if (!writes_done_) {
    writes_done_ = true;
    WritesDone(deadline);
  }
  DrainAndFinish(deadline);
}

void StepSession::Cancel() {
  if (finished_) return;
  finished_ = true;
  if (call_ == nullptr) return;
  context_->TryCancel();
  cancelled_ = true;
  DrainAndFinish();
}

// ---------------------------------------------------------- IndexerClient --

IndexerClient::IndexerClient(std::string address, ClientOptions options,
                             std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::Indexer::NewStub(channel_)) {}

absl::StatusOr<std::unique_ptr<IndexerClient>> IndexerClient::Connect(
    const std::string& address, const ClientOptions& options) {
  if (address.empty()) {
    return absl::InvalidArgumentError("address: expected host:port, got ''");
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes: expected > 0, got ", options.max_message_bytes));
  }
  // gRPC refuses bad metadata only when the call is made; say so here.
  auto key_ok = [](const std::string& key) {
    return !key.empty() && !absl::EndsWith(key, "-bin") &&
           std::all_of(key.begin(), key.end(), [](char c) {
             return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
                    c == '.';
           });
  };
  auto printable = [](const std::string& v) {
    return std::all_of(v.begin(), v.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
  };
  for (size_t i = 0; i < options.metadata.size(); ++i) {
    const auto& [key, value] = options.metadata[i];
    if (!key_ok(key) || !printable(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata[", i, "]: expected a lower-case key ([a-z0-9-_.], not -bin) and a "
          "printable ASCII value, got '", absl::CEscape(key), "': '", absl::CEscape(value), "'"));
    }
  }
  if (!options.client_id.empty()) {
    const std::string& key = options.client_id_header;
    if (!key_ok(key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "client_id_header: expected a lower-case metadata key ([a-z0-9-_.], not -bin), got '",
          absl::CEscape(key), "'"));
    }
    const std::string& id = options.client_id;
    if (!std::all_of(id.begin(), id.end(), [](char c) { return c >= 0x20 && c <= 0x7e; })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "client_id: expected printable ASCII, got '", absl::CEscape(id), "'"));
    }
  }
  grpc::ChannelArguments args;
  transport::AddChannelArguments(args, options.max_message_bytes);
  std::shared_ptr<grpc::ChannelCredentials> credentials = options.credentials;
  if (!credentials && options.tls) {
    ASSIGN_OR_RETURN(credentials, MakeTlsCredentials(*options.tls));
    if (!options.tls->server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls->server_name);
    }
  }
  if (!credentials) credentials = grpc::InsecureChannelCredentials();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(address, credentials, args);
  if (channel == nullptr) {
    return absl::InternalError(
        absl::StrCat("could not create a channel to ", address));
  }
  if (options.connect_timeout > absl::ZeroDuration() &&
      !channel->WaitForConnected(DeadlineAfter(options.connect_timeout))) {
    return absl::UnavailableError(
        absl::StrCat("could not connect to indexerd at ", address, " within ",
                     absl::FormatDuration(options.connect_timeout)));
  }
  return std::unique_ptr<IndexerClient>(
      new IndexerClient(address, options, std::move(channel)));
}

void IndexerClient::Prepare(grpc::ClientContext& context,
                            absl::Duration timeout) const {
  if (timeout != absl::InfiniteDuration()) {
    context.set_deadline(DeadlineAfter(timeout));
  }
  if (!options_.client_id.empty()) {
    context.AddMetadata(options_.client_id_header, options_.client_id);
  }
  for (const auto& [key, value] : options_.metadata) context.AddMetadata(key, value);
}

absl::StatusOr<v1::RegisterRegionResponse> IndexerClient::RegisterHostRegion(
    const std::string& name, const std::string& shm_name, uint64_t offset, uint64_t bytes) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::RegisterRegionRequest request;
  request.set_name(name);
  v1::HostRegion* h = request.mutable_host();
  h->set_shm_name(shm_name);
  h->set_offset(offset);
  h->set_bytes(bytes);
  v1::RegisterRegionResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->RegisterRegion(&context, request, &response)));
  return response;
}

absl::StatusOr<v1::AttachRingResponse> IndexerClient::AttachRing(uint64_t region,
                                                                 uint64_t offset) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::AttachRingRequest request;
  request.set_region(region);
  request.set_offset(offset);
  v1::AttachRingResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->AttachRing(&context, request, &response)));
  return response;
}

absl::StatusOr<bool> IndexerClient::DetachRing(uint64_t ring) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::DetachRingRequest request;
  request.set_ring(ring);
  v1::DetachRingResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->DetachRing(&context, request, &response)));
  return response.rolled_back();
}

absl::StatusOr<v1::RegisterRegionResponse> IndexerClient::RegisterMemfdToken(
    const std::string& name, const std::string& token, uint64_t offset, uint64_t bytes) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::RegisterRegionRequest request;
  request.set_name(name);
  v1::HostRegion* h = request.mutable_host();
  h->set_memfd_token(token);
  h->set_offset(offset);
  h->set_bytes(bytes);
  v1::RegisterRegionResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->RegisterRegion(&context, request, &response)));
  return response;
}

absl::StatusOr<v1::RegisterRegionResponse> IndexerClient::RegisterDeviceRegion(
    const std::string& name, const std::string& ipc_handle, const std::string& device_uuid,
    const std::string& pci_bus_id, uint64_t offset, uint64_t bytes) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::RegisterRegionRequest request;
  request.set_name(name);
  v1::DeviceRegion* d = request.mutable_device();
  d->set_ipc_handle(ipc_handle);
  d->set_device_uuid(device_uuid);
  d->set_pci_bus_id(pci_bus_id);
  d->set_offset(offset);
  d->set_bytes(bytes);
  v1::RegisterRegionResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->RegisterRegion(&context, request, &response)));
  return response;
}

absl::Status IndexerClient::UnregisterRegion(uint64_t region) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::UnregisterRegionRequest request;
  request.set_region(region);
  v1::UnregisterRegionResponse response;
  return FromGrpcStatus(stub_->UnregisterRegion(&context, request, &response));
}

absl::StatusOr<std::vector<v1::RegionInfo>> IndexerClient::ListRegions() {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::ListRegionsResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(stub_->ListRegions(&context, v1::ListRegionsRequest(), &response)));
  return std::vector<v1::RegionInfo>(response.regions().begin(), response.regions().end());
}

absl::StatusOr<v1::ServerInfo> IndexerClient::GetServerInfo() {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::ServerInfo info;
  RETURN_IF_ERROR(FromGrpcStatus(
      stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &info)));
  return info;
}

absl::StatusOr<uint64_t> IndexerClient::Release(
    const std::vector<v1::SequenceId>& ids) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::ReleaseRequest request;
  for (const v1::SequenceId& id : ids) *request.add_ids() = id;
  v1::ReleaseResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(stub_->Release(&context, request, &response)));
  return response.released_pages();
}

absl::StatusOr<uint64_t> IndexerClient::WriteEntries(
    const v1::WriteEntriesRequest& request) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::WriteEntriesResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(stub_->WriteEntries(&context, request, &response)));
  return response.seq_len();
}

absl::StatusOr<v1::ListSequencesResponse> IndexerClient::ListSequences(
    uint32_t page_size, const std::string& page_token) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::ListSequencesRequest request;
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  v1::ListSequencesResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->ListSequences(&context, request, &response)));
  return response;
}

absl::Status IndexerClient::ExportEntries(
    const v1::ExportEntriesRequest& request,
    const std::function<absl::Status(v1::WriteEntriesRequest&)>& on_message) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  std::unique_ptr<grpc::ClientReader<v1::WriteEntriesRequest>> reader =
      stub_->ExportEntries(&context, request);
  v1::WriteEntriesRequest message;
  while (reader->Read(&message)) {
    absl::Status s = on_message(message);
    if (!s.ok()) {
      context.TryCancel();
      (void)reader->Finish();
      return s;
    }
  }
  return FromGrpcStatus(reader->Finish());
}

absl::StatusOr<uint64_t> IndexerClient::CopySequence(const v1::SequenceId& id, IndexerClient& to,
                                                     uint64_t max_message_bytes) {
  v1::ExportEntriesRequest request;
  *request.mutable_id() = id;
  request.set_max_message_bytes(max_message_bytes);
  uint64_t len = 0;
  RETURN_IF_ERROR(ExportEntries(request, [&](v1::WriteEntriesRequest& m) -> absl::Status {
    absl::StatusOr<uint64_t> imported = to.WriteEntries(m);
    if (!imported.ok()) return imported.status();
    len = *imported;
    return absl::OkStatus();
  }));
  return len;
}

absl::StatusOr<std::unique_ptr<StepSession>> IndexerClient::OpenStep(
    const v1::StepHeader& header) {
  auto context = std::make_unique<grpc::ClientContext>();
  Prepare(*context, options_.step_timeout);
  std::unique_ptr<StepSession> session(
      new StepSession(channel_, std::move(context), options_.abort_grace,
                      options_.busy_poll));
  if (!session->Start()) return session->FailStream("opening the step stream");
  v1::StepRequest message;
  *message.mutable_header() = header;
  grpc::ByteBuffer bytes;
  if (!SerializeStepRequest(message, &bytes)) {
    session->Cancel();
    return absl::InternalError("could not serialize the step header");
  }
  if (!session->WriteMessage(bytes)) {
    return session->FailStream("sending the step header");
  }
  return session;
}

// ---------------------------------------------------------------- helpers --

bool TuneProcessAllocator() { return transport::TuneAllocator(); }

v1::SequenceId NumericSequenceId(uint64_t num) {
  v1::SequenceId id;
  id.set_num(num);
  return id;
}

v1::SequenceId NamedSequenceId(const std::string& name) {
  v1::SequenceId id;
  id.set_name(name);
  return id;
}

std::string SequenceIdString(const v1::SequenceId& id) {
  switch (id.id_case()) {
    case v1::SequenceId::kNum:
      return absl::StrCat(id.num());
    case v1::SequenceId::kName:
      return absl::StrCat("\"", id.name(), "\"");
    default:
      return "(unset)";
  }
}

int64_t DataTypeSize(v1::DataType dtype) {
  switch (dtype) {
    case v1::FP32:
    case v1::INT32:
      return 4;
    case v1::BF16:
    case v1::FP16:
      return 2;
    case v1::UINT8:
    case v1::FP8_E4M3:
      return 1;
    default:
      return 0;
  }
}

int64_t NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    n *= d;
  }
  return n;
}

v1::Tensor MakeTensor(v1::DataType dtype, absl::Span<const int64_t> shape,
                      const void* data, size_t bytes) {
  v1::Tensor tensor;
  tensor.set_dtype(dtype);
  for (int64_t d : shape) tensor.add_shape(d);
  tensor.set_data(static_cast<const char*>(data), bytes);
  return tensor;
}

v1::Tensor MakeRefTensor(v1::DataType dtype, absl::Span<const int64_t> shape,
                         uint64_t region, uint64_t offset) {
  v1::Tensor tensor;
  tensor.set_dtype(dtype);
  for (int64_t d : shape) tensor.add_shape(d);
  *tensor.mutable_ref() = MakeTensorRef(
      region, offset, static_cast<uint64_t>(NumElements(shape) * DataTypeSize(dtype)));
  return tensor;
}

v1::TensorRef MakeTensorRef(uint64_t region, uint64_t offset, uint64_t bytes) {
  v1::TensorRef ref;
  ref.set_region(region);
  ref.set_offset(offset);
  ref.set_bytes(bytes);
  return ref;
}

v1::Tensor MakeFp32Tensor(absl::Span<const float> values,
                          absl::Span<const int64_t> shape) {
  return MakeTensor(v1::FP32, shape, values.data(),
                    values.size() * sizeof(float));
}

v1::Tensor MakeInt32Tensor(absl::Span<const int32_t> values,
                           absl::Span<const int64_t> shape) {
  return MakeTensor(v1::INT32, shape, values.data(),
                    values.size() * sizeof(int32_t));
}

v1::Tensor MakeByteTensor(v1::DataType dtype, absl::Span<const uint8_t> values,
                          absl::Span<const int64_t> shape) {
  return MakeTensor(dtype, shape, values.data(), values.size());
}

absl::StatusOr<std::vector<int32_t>> ReadInt32Tensor(
    const v1::Tensor& tensor, absl::Span<const int64_t> expected_shape,
    const std::string& field) {
  const std::vector<int64_t> shape(tensor.shape().begin(),
                                   tensor.shape().end());
  const int64_t n = NumElements(shape);
  auto describe = [&]() {
    return absl::StrCat(ShapeString(shape), " ",
                        v1::DataType_Name(tensor.dtype()), " (",
                        tensor.data().size(), " bytes)");
  };
  if (tensor.dtype() != v1::INT32) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected INT32, got ", describe()));
  }
  if (!expected_shape.empty() &&
      !std::equal(shape.begin(), shape.end(), expected_shape.begin(),
                  expected_shape.end())) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected ", ShapeString(expected_shape), " INT32, got ",
        describe()));
  }
  if (n < 0 || static_cast<uint64_t>(n) * 4 != tensor.data().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected ", ShapeString(shape), " INT32 (",
        n < 0 ? 0 : n * 4, " bytes), got ", describe()));
  }
  std::vector<int32_t> values(static_cast<size_t>(n));
  if (n > 0) std::memcpy(values.data(), tensor.data().data(), n * 4);
  return values;
}

}  // namespace indexer::client
