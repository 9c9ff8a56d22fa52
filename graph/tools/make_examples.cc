// Writes the shipped example graphs (graph/examples/*.json) from their
// generators in graph/synthetic.h:  rdmaflow-make-examples OUT_DIR
#include <cstdio>
#include <fstream>
#include <string>

#include "graph/graph_json.h"
#include "graph/synthetic.h"
#include "tools/cli.h"

int main(int argc, char** argv) {
  std::string dir;
  CLI::App app{"Writes the shipped example graphs from their generators in graph/synthetic.h.",
               "rdmaflow-make-examples"};
  rdmaflow::cli::configure(app);
  app.add_option("out_dir", dir, "where to write them (graph/examples)")
      ->type_name("OUT_DIR")
      ->required();
  if (auto exit_code = rdmaflow::cli::parse(app, argc, argv)) return *exit_code;
  namespace syn = rdmaflow::graph::synthetic;
  const std::pair<const char*, rdmaflow::graph::GraphFile> examples[] = {
      {"mlp_model_parallel.json", syn::mlp_model_parallel()},
      {"parameter_server.json", syn::parameter_server()},
      {"unrolled_rnn.json", syn::unrolled_rnn()},
  };
  for (const auto& [name, f] : examples) {
    const std::string path = dir + "/" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << rdmaflow::graph::write_graph_json(f.graph, &f.placement);
    if (!out.flush()) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    std::printf("wrote %s (%zu ops)\n", path.c_str(), f.graph.num_ops());
  }
  return 0;
}
