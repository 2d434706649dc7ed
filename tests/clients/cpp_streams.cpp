// C++ client: std::ifstream (read, seekg/tellg, getline), std::filesystem
// (recursive_directory_iterator, file_size, status, exists, last_write_time).
// usage: cpp_streams ROOT LISTFILE
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

static uint64_t fnv(uint64_t h, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 1099511628211ULL; }
    return h;
}

int main(int argc, char **argv) {
    if (argc != 3) { std::cerr << "usage: cpp_streams ROOT LIST\n"; return 2; }
    const fs::path root = argv[1];
    std::vector<std::string> lines;

    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        const auto &e = *it;
        std::string rel = fs::relative(e.path(), root).generic_string();
        std::ostringstream o;
        o << "iter " << rel << " depth=" << it.depth();
        if (e.is_directory()) o << " dir";
        else if (e.is_regular_file()) o << " file size=" << e.file_size() << " fs_size=" << fs::file_size(e.path());
        else if (e.is_symlink()) o << " symlink";
        auto perms = e.status().permissions();
        o << " perms=" << std::oct << (unsigned)perms << std::dec;
        lines.push_back(o.str());
    }
    if (ec) lines.push_back("iter error " + ec.message());
    std::sort(lines.begin(), lines.end());
    std::cout << "== recursive_directory_iterator (" << lines.size() << ")\n";
    for (auto &l : lines) std::cout << l << "\n";

    std::ifstream list(argv[2]);
    std::string rel;
    std::vector<char> buf(1 << 16);
    while (std::getline(list, rel)) {
        if (rel.empty()) continue;
        fs::path p = root / rel;
        std::ifstream in(p, std::ios::binary);
        std::cout << rel;
        if (!in) { std::cout << " ifstream failed\n"; continue; }
        uint64_t h = 1469598103934665603ULL; size_t total = 0;
        while (in.read(buf.data(), buf.size()) || in.gcount() > 0) { h = fnv(h, buf.data(), in.gcount()); total += in.gcount(); }
        in.clear();
        in.seekg(0, std::ios::end); auto end = (long long)in.tellg();
        in.seekg(end / 2); char mid[64]; in.read(mid, sizeof mid); auto got = in.gcount(); in.clear();
        uint64_t hm = fnv(1469598103934665603ULL, mid, got);
        in.seekg(0);
        std::string line; long nlines = 0; size_t longest = 0;
        while (std::getline(in, line)) { nlines++; longest = std::max(longest, line.size()); }
        // a whole-file read through rdbuf
        std::ifstream in2(p, std::ios::binary); std::ostringstream ss; ss << in2.rdbuf();
        std::string all = ss.str();
        std::cout << " read=" << total << "/" << std::hex << h << std::dec << " tellg=" << end << " mid=" << got << "/" << std::hex << hm
                  << std::dec << " getline=" << nlines << "/" << longest << " rdbuf=" << all.size() << "/" << std::hex
                  << fnv(1469598103934665603ULL, all.data(), all.size()) << std::dec
                  << " file_size=" << fs::file_size(p, ec) << " exists=" << fs::exists(p) << " is_regular=" << fs::is_regular_file(p)
                  << " mtime=" << fs::last_write_time(p, ec).time_since_epoch().count() << "\n";
    }
    for (const char *bad : {"does-not-exist", "own/edge/one/child"}) {
        std::error_code e1, e2;
        bool ex = fs::exists(root / bad, e1);
        auto s = fs::file_size(root / bad, e2);
        std::ifstream in(root / bad);
        std::cout << "missing " << bad << " exists=" << ex << " exists_err=" << e1.value() << " file_size_err=" << e2.value()
                  << " size=" << (e2 ? 0 : s) << " ifstream=" << (in ? "open" : "failed") << "\n";
    }
    std::cout << "is_directory own/edge=" << fs::is_directory(root / "own/edge") << " emptydir empty=" << fs::is_empty(root / "own/edge/emptydir") << "\n";
    return 0;
}
