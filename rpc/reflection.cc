#include "rpc/reflection.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

namespace rdmarpc {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

// Appends `file`'s imports (recursively), then `file`, each once.
void AddWithImports(const FileDescriptor* file, std::set<const FileDescriptor*>& seen,
                    std::vector<const FileDescriptor*>& out) {
  if (!seen.insert(file).second) return;
  for (int i = 0; i < file->dependency_count(); ++i) AddWithImports(file->dependency(i), seen, out);
  out.push_back(file);
}

}  // namespace

Status ReflectionService::Attach(Server& server) {
  if (Status s = server.AddService(*this); !s.ok()) return s;
  server_ = &server;
  return Status();
}

boost::asio::awaitable<Status> ReflectionService::ListServices(
    ServerContext&, const reflection::v1::ListServicesRequest&,
    reflection::v1::ListServicesResponse& reply) {
  std::vector<std::string> names;
  for (const rdmarpc::Service* s : server_->services())
    names.emplace_back(s->rdmarpc_service_name());
  std::sort(names.begin(), names.end());
  for (auto& n : names) reply.add_services(std::move(n));
  co_return Status();
}

boost::asio::awaitable<Status> ReflectionService::FileContainingSymbol(
    ServerContext&, const reflection::v1::FileContainingSymbolRequest& request,
    reflection::v1::FileContainingSymbolResponse& reply) {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  // What may be shown: the files of the hosted services and what they import.
  std::set<const FileDescriptor*> allowed_seen;
  std::vector<const FileDescriptor*> allowed;
  for (const rdmarpc::Service* s : server_->services()) {
    if (auto* d = pool->FindServiceByName(std::string(s->rdmarpc_service_name()))) {
      AddWithImports(d->file(), allowed_seen, allowed);
    }
  }
  const FileDescriptor* file = pool->FindFileContainingSymbol(request.symbol());
  if (file == nullptr || !allowed_seen.count(file)) {
    co_return Status(StatusCode::kNotFound,
                     "no symbol '" + request.symbol() + "' among this server's services");
  }
  std::set<const FileDescriptor*> seen;
  std::vector<const FileDescriptor*> files;
  AddWithImports(file, seen, files);
  google::protobuf::FileDescriptorProto proto;
  for (const FileDescriptor* f : files) {
    proto.Clear();
    f->CopyTo(&proto);
    proto.SerializeToString(reply.add_file_descriptor_protos());
  }
  co_return Status();
}

}  // namespace rdmarpc
