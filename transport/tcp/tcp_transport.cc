// Placeholder: the TCP backend is being written (issue 2).
namespace rdmaflow {
void register_tcp_transport() {}
}  // namespace rdmaflow
