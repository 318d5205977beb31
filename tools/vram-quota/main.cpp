// vram-quota: administers a quota ledger, the memory limits that processes sharing a GPU
// hold each other to (vram/adaptor/quota_ledger.hpp, docs/quotas.md).

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <vram/adaptor/quota_ledger.hpp>
#include <vram/core/bytes.hpp>
#include <vram/core/parse.hpp>
#include <vram/core/error.hpp>

namespace {

const char* usage =
    "usage: vram-quota COMMAND LEDGER [arguments]\n"
    "\n"
    "LEDGER is a name in /dev/shm (vram-gpu0) or a path (one ledger per device).\n"
    "\n"
    "commands:\n"
    "  create LEDGER [--mode OCTAL] [--tenants-may-set-limits]\n"
    "                          a new ledger with no tenants; --mode: who may attach and\n"
    "                          charge (default 0660); limits stay the operator's unless\n"
    "                          --tenants-may-set-limits\n"
    "  set LEDGER TENANT [--hard SIZE|none] [--soft SIZE|none]\n"
    "                          creates TENANT (a path: job/model/class) if missing and sets\n"
    "                          its limits; SIZE as 512M, 40G, 1.5GiB\n"
    "  list LEDGER [--json]    every tenant (usage of it and its descendants, peak, limits,\n"
    "                          refusals) and every attached process (pid, command, alive,\n"
    "                          charges per tenant)\n"
    "  reclaim LEDGER [--json] returns the charges of processes that died\n"
    "  check LEDGER            verifies that usage equals the processes' charges\n"
    "  remove LEDGER           deletes the ledger (attached processes keep their mapping)\n"
    "\n"
    "exit status: 0 done, 1 the ledger refused or could not be used (missing, not a ledger),\n"
    "2 a bad command line\n";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

/// A limit for people: "none", or bytes with a binary unit.
std::string for_people(std::size_t bytes) {
  return bytes == vram::quota_ledger::unlimited ? "none" : vram::format_bytes(bytes);
}

std::string json_limit(std::size_t bytes) {
  return bytes == vram::quota_ledger::unlimited ? "null" : std::to_string(bytes);
}

std::size_t parse_limit(const std::string& flag, const std::string& text) {
  if (text == "none") return vram::quota_ledger::unlimited;
  std::optional<std::size_t> b = vram::parse_bytes(text);
  if (!b) throw usage_error(vram::refusal(flag, text, std::string(vram::size_grammar) + "; or none"));
  return *b;
}

/// File permissions: octal digits only (0660, 640), at most 0777.
mode_t parse_mode(const std::string& text) {
  unsigned m = 0;
  bool octal = !text.empty() && text.size() <= 4;
  for (char c : text) {
    octal = octal && c >= '0' && c <= '7';
    m = m * 8 + static_cast<unsigned>(c - '0');
  }
  if (!octal || m > 0777) throw usage_error(vram::refusal("--mode", text, "octal permissions, 0 to 0777 (e.g. 0660)"));
  return static_cast<mode_t>(m);
}

/// The value after the flag at `i` (which moves to it).
const std::string& value_of(const std::vector<std::string>& args, std::size_t& i) {
  if (i + 1 >= args.size()) throw usage_error(args[i] + ": needs a value");
  return args[++i];
}

int create(const std::string& ledger, const std::vector<std::string>& args) {
  vram::ledger_options options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--tenants-may-set-limits") {
      options.tenants_may_set_limits = true;
    } else if (args[i] == "--mode") {
      options.mode = parse_mode(value_of(args, i));
    } else {
      throw usage_error("create: unknown argument '" + args[i] + "'");
    }
  }
  auto l = vram::quota_ledger::create(ledger, options);
  std::cout << "created " << l->path() << "\n";
  return 0;
}

int set(const std::string& ledger, const std::vector<std::string>& args) {
  if (args.empty()) throw usage_error("set: which tenant?");
  std::optional<std::size_t> hard, soft;
  for (std::size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--hard") hard = parse_limit("--hard", value_of(args, i));
    else if (args[i] == "--soft") soft = parse_limit("--soft", value_of(args, i));
    else throw usage_error("set: unknown argument '" + args[i] + "'");
  }
  auto l = vram::quota_ledger::attach(ledger, vram::ledger_access::admin);
  vram::tenant t = l->add_tenant(args[0]);
  if (hard) l->set_hard_limit(t, *hard);
  if (soft) l->set_soft_limit(t, *soft);
  std::cout << l->path_of(t) << ": hard " << for_people(l->hard_limit(t)) << ", soft " << for_people(l->soft_limit(t))
            << "\n";
  return 0;
}

bool json_flag(const std::vector<std::string>& args, const char* command) {
  if (args.empty()) return false;
  if (args.size() == 1 && args[0] == "--json") return true;
  throw usage_error(std::string(command) + ": unknown argument '" + args[0] + "'");
}

int list(const std::string& ledger, const std::vector<std::string>& args) {
  const bool json = json_flag(args, "list");
  // Read access needs no write permission; what it shows is read without the charge mutex.
  auto l = vram::quota_ledger::attach(ledger, vram::ledger_access::read);
  const std::size_t n = l->tenant_count();
  std::vector<vram::quota_ledger::process> processes = l->processes();
  std::ostringstream out;
  if (json) {
    out << "{\"ledger\": " << json_string(l->path()) << ", \"tenants\": [";
    for (std::uint32_t i = 0; i < n; ++i) {
      vram::tenant t{i};
      out << (i ? ", " : "") << "{\"tenant\": " << json_string(l->path_of(t)) << ", \"usage\": " << l->usage(t)
          << ", \"peak\": " << l->peak_usage(t) << ", \"hard\": " << json_limit(l->hard_limit(t))
          << ", \"soft\": " << json_limit(l->soft_limit(t)) << ", \"refusals\": " << l->refusals(t) << "}";
    }
    out << "], \"processes\": [";
    for (std::size_t k = 0; k < processes.size(); ++k) {
      const auto& p = processes[k];
      out << (k ? ", " : "") << "{\"slot\": " << p.slot << ", \"pid\": " << p.pid
          << ", \"command\": " << json_string(p.command) << ", \"alive\": " << (p.alive ? "true" : "false")
          << ", \"charged\": {";
      for (std::size_t c = 0; c < p.charged.size(); ++c)
        out << (c ? ", " : "") << json_string(l->path_of(p.charged[c].first)) << ": " << p.charged[c].second;
      out << "}}";
    }
    out << "]}\n";
  } else {
    out << l->path() << ": " << n << " tenants, " << processes.size() << " processes\n\n";
    char line[256];
    std::snprintf(line, sizeof line, "%-32s %12s %12s %12s %12s %9s\n", "TENANT", "USAGE", "PEAK", "HARD", "SOFT",
                  "REFUSALS");
    out << line;
    for (std::uint32_t i = 0; i < n; ++i) {
      vram::tenant t{i};
      std::snprintf(line, sizeof line, "%-32s %12s %12s %12s %12s %9zu\n", l->path_of(t).c_str(),
                    for_people(l->usage(t)).c_str(), for_people(l->peak_usage(t)).c_str(),
                    for_people(l->hard_limit(t)).c_str(), for_people(l->soft_limit(t)).c_str(), l->refusals(t));
      out << line;
    }
    out << "\n";
    std::snprintf(line, sizeof line, "%-6s %-8s %-16s %-6s %s\n", "SLOT", "PID", "COMMAND", "ALIVE", "CHARGED");
    out << line;
    for (const auto& p : processes) {
      std::string charged;
      for (const auto& [t, bytes] : p.charged) charged += (charged.empty() ? "" : ", ") + l->path_of(t) + " " + for_people(bytes);
      std::snprintf(line, sizeof line, "%-6u %-8d %-16s %-6s ", p.slot, p.pid, p.command.c_str(), p.alive ? "yes" : "no");
      out << line << (charged.empty() ? "-" : charged) << "\n";
    }
  }
  std::cout << out.str();
  return 0;
}

int reclaim(const std::string& ledger, const std::vector<std::string>& args) {
  const bool json = json_flag(args, "reclaim");
  auto l = vram::quota_ledger::attach(ledger, vram::ledger_access::admin);
  std::size_t n = l->reclaim();
  if (json) std::cout << "{\"ledger\": " << json_string(l->path()) << ", \"reclaimed\": " << n << "}\n";
  else std::cout << "reclaimed the charges of " << n << " dead process" << (n == 1 ? "" : "es") << "\n";
  return 0;
}

int check(const std::string& ledger, const std::vector<std::string>& args) {
  if (!args.empty()) throw usage_error("check: unknown argument '" + args[0] + "'");
  auto l = vram::quota_ledger::attach(ledger, vram::ledger_access::admin);  // attach checks, under the mutex
  l->check_invariants();
  std::cout << l->path() << ": consistent\n";
  return 0;
}

int remove_ledger(const std::string& ledger, const std::vector<std::string>& args) {
  if (!args.empty()) throw usage_error("remove: unknown argument '" + args[0] + "'");
  vram::quota_ledger::remove(ledger);
  std::cout << "removed " << vram::quota_ledger::resolve(ledger) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "-h" || args[0] == "--help")) {
    std::cout << usage;
    return 0;
  }
  try {
    if (args.empty()) throw usage_error("no command");
    if (args.size() < 2) throw usage_error(args[0] + ": which ledger?");
    const std::string command = args[0], ledger = args[1];
    std::vector<std::string> rest(args.begin() + 2, args.end());
    if (command == "create") return create(ledger, rest);
    if (command == "set") return set(ledger, rest);
    if (command == "list") return list(ledger, rest);
    if (command == "reclaim") return reclaim(ledger, rest);
    if (command == "check") return check(ledger, rest);
    if (command == "remove") return remove_ledger(ledger, rest);
    throw usage_error("unknown command " + vram::quoted(command));
  } catch (const usage_error& e) {
    std::cerr << "vram-quota: " << e.what() << " (see vram-quota --help)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "vram-quota: " << e.what() << "\n";
    return 1;
  }
}
