// Placeholder until the graph analyzer lands (issue 4).
namespace rdmaflow::graph_detail {
int placeholder() { return 0; }
}  // namespace rdmaflow::graph_detail
