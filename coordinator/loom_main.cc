// `loom`: the command line. Subcommands dispatch to coordinator/*_command.cc.
#include <cstdio>
#include <string_view>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: loom <command> [args]\n");
    return 2;
  }
  std::fprintf(stderr, "loom: unknown command '%s'\n", argv[1]);
  return 2;
}
