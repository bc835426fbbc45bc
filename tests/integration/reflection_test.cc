// gRPC server reflection on the daemon (what grpcurl and grpc_cli use): the
// installed indexerd binary runs as a child process (this test links the
// reflection stubs from Debian's grpc-proto, which libgrpc++_reflection
// inside the daemon holds a copy of), and a reflection client lists its
// services and fetches the wire contract's descriptor by symbol.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "google/protobuf/descriptor.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

extern char** environ;

namespace {

namespace refl = grpc::reflection::v1alpha;

// indexerd --profile demo on 127.0.0.1:0 for the test's lifetime.
class DaemonProcess {
 public:
  DaemonProcess() {
    char tmpl[] = "/tmp/reflection_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
    port_file_ = dir_ + "/port";
    std::string bin = INDEXERD_PATH;
    std::vector<std::string> args = {bin,         "--profile", "demo",       "--device",
                                     "cpu",       "--threads", "1",          "--cache-mb",
                                     "32",        "--listen",  "127.0.0.1:0", "--port-file",
                                     port_file_,  "--log-level", "warn"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, bin.c_str(), nullptr, nullptr, argv.data(), environ), 0);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (port_ == 0 && std::chrono::steady_clock::now() < end) {
      std::ifstream in(port_file_);
      if (!(in >> port_)) port_ = 0;
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~DaemonProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    std::remove(port_file_.c_str());
    rmdir(dir_.c_str());
  }
  int port() const { return port_; }

 private:
  std::string dir_, port_file_;
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST(ReflectionTest, ListsServicesAndServesTheContract) {
  DaemonProcess daemon;
  ASSERT_GT(daemon.port(), 0) << "indexerd did not start";
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(daemon.port()),
                                     grpc::InsecureChannelCredentials());
  auto stub = refl::ServerReflection::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->ServerReflectionInfo(&ctx);

  refl::ServerReflectionRequest list;
  list.set_list_services("*");
  ASSERT_TRUE(stream->Write(list));
  refl::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_TRUE(resp.has_list_services_response()) << resp.DebugString();
  std::set<std::string> services;
  for (const auto& s : resp.list_services_response().service()) services.insert(s.name());
  EXPECT_TRUE(services.count("indexer.v1.Indexer")) << resp.DebugString();
  EXPECT_TRUE(services.count("grpc.health.v1.Health")) << resp.DebugString();

  // The descriptor of the service, as grpcurl fetches it to build requests.
  refl::ServerReflectionRequest sym;
  sym.set_file_containing_symbol("indexer.v1.Indexer");
  ASSERT_TRUE(stream->Write(sym));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_TRUE(resp.has_file_descriptor_response()) << resp.DebugString();
  bool found = false;
  for (const std::string& bytes : resp.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto fd;
    ASSERT_TRUE(fd.ParseFromString(bytes));
    if (fd.name() != "indexer/v1/indexer.proto") continue;
    found = true;
    std::set<std::string> methods;
    for (const auto& svc : fd.service()) {
      for (const auto& m : svc.method()) methods.insert(m.name());
    }
    for (const char* m : {"GetServerInfo", "Step", "WriteEntries", "Release"}) {
      EXPECT_TRUE(methods.count(m)) << m;
    }
  }
  EXPECT_TRUE(found) << resp.DebugString();
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
