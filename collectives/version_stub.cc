// Placeholder until the collectives land (issue 5).
namespace rdmaflow::collectives_detail {
int placeholder() { return 0; }
}  // namespace rdmaflow::collectives_detail
