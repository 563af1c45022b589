// netdelay: a userspace layer-3 switch with a fixed one-way delay, the link delay of the simulated
// hosts of scripts/netns_hosts.sh on kernels without netem (docs/cluster.md, "The delay switch").
//
// It makes one TUN device per host (the names on its command line, in the network namespace where
// it runs), says "ready" on standard output, and from then on forwards every IPv4 packet read from
// any device to the device of the packet's destination: address SUBNET.(j+1) is device j. Anything
// else (not IPv4, or not addressed to one of the hosts) is dropped and counted, so no packet goes
// anywhere but the simulated hosts. Each packet is released DELAY after it was read, in the order
// read (one FIFO: one delay for all, so release order is arrival order). netns_hosts.sh moves each
// device into its host's namespace as eth0; the open file descriptor keeps working there, and the
// devices disappear when netdelay exits (they are not persistent).
//
// Control file (--control FILE, read at start and again on SIGHUP), one setting a line:
//   delay_ns N        the one-way delay in nanoseconds (delay_us N: in microseconds)
//   down I J ...      the devices whose link is down: their carrier is off (the host sees
//                     NO-CARRIER, as with a pulled cable) and packets from or to them are dropped
// Every reload prints "netdelay: applied delay_ns N, down: ..." to standard error (the script
// waits for that line); a file that does not parse keeps the previous settings and says why.
//
// Timing: timer slack 1 ns and ppoll with a nanosecond timeout until the head packet's release,
// on CLOCK_MONOTONIC; no spinning. The timeout ends early by the timer's own lateness (the least
// of the previous 64 timed wakes: a few us on a bare machine, about 25 us in a VM), and a wake
// that still comes early sleeps the rest: no packet leaves before its time. Memory: one pool
// (--pool-mib, default 64) holding the queued packets back to back; when it is full, packets are
// dropped and counted. Offload (default): the devices carry a virtio_net_hdr (IFF_VNET_HDR) and
// accept checksum and TCP segmentation offload (TUNSETOFFLOAD), so a host's TCP hands over 64 KiB
// segments that travel as one packet, header passed through unchanged (MTU 1500 by default, as a
// veth's); --no-offload makes plain devices of --mtu bytes (default 9000) instead, each packet
// one read and one write: slower (6.9 against 8-10 Gbit/s for one TCP stream, docs/cluster.md).
//
// SIGTERM or SIGINT: prints the counters (forwarded, dropped by reason, the longest queue, how late
// the packets left on average and at most) to standard error and exits 0. A failed system call
// prints one line naming it and exits 1.
//
// Usage: netdelay [--control FILE] [--delay-us N] [--subnet A.B.C.0] [--no-offload] [--mtu N]
//                 [--txqueuelen N] [--pool-mib N] DEVICE...
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

// sizeof(struct virtio_net_hdr), TUN's default header length: flags, gso_type, then hdr_len,
// gso_size, csum_start and csum_offset of 16 bits (<linux/virtio_net.h> does not compile as C++).
constexpr size_t kVnetHdr = 10;

[[noreturn]] void fail(const std::string& call) {
  std::fprintf(stderr, "netdelay: %s failed: %s\n", call.c_str(), std::strerror(errno));
  std::exit(1);
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "netdelay: %s\nusage: netdelay [--control FILE] [--delay-us N] [--subnet A.B.C.0] "
               "[--no-offload] [--mtu N] [--txqueuelen N] [--pool-mib N] DEVICE...\n",
               why.c_str());
  std::exit(2);
}

int64_t now_ns() {
  timespec ts{};
  if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) fail("clock_gettime(CLOCK_MONOTONIC)");
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

bool parse_int(std::string_view s, int64_t& out) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc{} && p == end;
}

// The queued packets, back to back in one buffer (a ring of variable-size records): each is a
// header and the packet, rounded up to 16 bytes. A record never wraps: when the space left at the
// end is too small, writing goes on at the start and the reader skips the unused end.
class Pool {
 public:
  struct Header {
    int64_t read_ns;  // when it was read
    uint32_t len;
    uint16_t from, to;
  };

  explicit Pool(size_t bytes)
      : buf_(std::make_unique_for_overwrite<unsigned char[]>(bytes)), cap_(bytes), end_(bytes) {}

  // Room for a packet of up to `max` bytes, or nullptr when the pool is full.
  unsigned char* reserve(size_t max) {
    const size_t need = record(max);
    if (count_ == 0) head_ = tail_ = 0, end_ = cap_;
    if (tail_ > head_ || count_ == 0) {  // free: [tail, cap) and [0, head)
      if (cap_ - tail_ >= need) return buf_.get() + tail_ + sizeof(Header);
      if (head_ < need) return nullptr;
      end_ = tail_;  // wrap: the reader goes back to 0 at end_
      tail_ = 0;
      return buf_.get() + sizeof(Header);
    }
    // Wrapped (tail before head, or equal when full): free is [tail, head).
    return head_ - tail_ >= need ? buf_.get() + tail_ + sizeof(Header) : nullptr;
  }

  // Queues the packet written where reserve() said.
  void commit(const Header& h) {
    std::memcpy(buf_.get() + tail_, &h, sizeof h);
    tail_ += record(h.len);
    ++count_;
    bytes_ += record(h.len);
  }

  bool empty() const { return count_ == 0; }
  size_t count() const { return count_; }
  size_t bytes() const { return bytes_; }

  Header front() const {
    Header h;
    std::memcpy(&h, buf_.get() + head_, sizeof h);
    return h;
  }
  const unsigned char* front_data() const { return buf_.get() + head_ + sizeof(Header); }

  void pop() {
    const size_t r = record(front().len);
    head_ += r;
    bytes_ -= r;
    --count_;
    if (head_ == end_ && count_ > 0) head_ = 0, end_ = cap_;
  }

 private:
  static size_t record(size_t len) { return (sizeof(Header) + len + 15) & ~size_t{15}; }

  std::unique_ptr<unsigned char[]> buf_;
  size_t cap_, end_;  // end_: where the records before a wrap end
  size_t head_ = 0, tail_ = 0, count_ = 0, bytes_ = 0;
};
static_assert(sizeof(Pool::Header) == 16);

struct Options {
  std::string control;
  int64_t delay_ns = 0;
  uint32_t subnet = 0x0a4d0000;  // 10.77.0.0
  bool offload = true;
  int mtu = 0;  // 0: 1500 with offload (segments are 64 KiB anyway), 9000 without
  int txqueuelen = 10000;
  int64_t pool_mib = 64;
  std::vector<std::string> devices;
};

Options parse_options(int argc, char** argv) {
  Options o;
  auto number = [&](int& i, int64_t lo, int64_t hi) {
    if (i + 1 >= argc) usage(std::string(argv[i]) + " needs a value");
    int64_t v = 0;
    if (!parse_int(argv[i + 1], v) || v < lo || v > hi) {
      usage(std::string(argv[i]) + ": '" + argv[i + 1] + "' is not a number in " +
            std::to_string(lo) + ".." + std::to_string(hi));
    }
    ++i;
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--control") {
      if (i + 1 >= argc) usage("--control needs a file");
      o.control = argv[++i];
    } else if (a == "--delay-us") {
      o.delay_ns = number(i, 0, 10'000'000) * 1000;
    } else if (a == "--subnet") {
      if (i + 1 >= argc) usage("--subnet needs an address A.B.C.0");
      in_addr addr{};
      if (inet_pton(AF_INET, argv[i + 1], &addr) != 1 || (ntohl(addr.s_addr) & 0xff) != 0)
        usage(std::string("--subnet: '") + argv[i + 1] + "' is not an address A.B.C.0");
      o.subnet = ntohl(addr.s_addr);
      ++i;
    } else if (a == "--no-offload") {
      o.offload = false;
    } else if (a == "--mtu") {
      o.mtu = static_cast<int>(number(i, 576, 65535));
    } else if (a == "--txqueuelen") {
      o.txqueuelen = static_cast<int>(number(i, 1, 1'000'000));
    } else if (a == "--pool-mib") {
      o.pool_mib = number(i, 1, 4096);
    } else if (a.starts_with("-")) {
      usage("unknown option " + std::string(a));
    } else {
      if (a.empty() || a.size() >= IFNAMSIZ) usage("bad device name '" + std::string(a) + "'");
      o.devices.emplace_back(a);
    }
  }
  if (o.devices.empty()) usage("no devices named");
  if (o.devices.size() > 254) usage("at most 254 devices (one /24)");
  if (o.mtu == 0) o.mtu = o.offload ? 1500 : 9000;
  return o;
}

// The settings of the control file.
struct Control {
  int64_t delay_ns = 0;
  std::vector<bool> down;
};

// Reads the control file into `c`; false (and `why`) when it cannot be read or parsed.
bool read_control(const std::string& path, size_t devices, Control& c, std::string& why) {
  std::ifstream in(path);
  if (!in) {
    why = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  Control next{c.delay_ns, std::vector<bool>(devices, false)};
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    std::istringstream words(line);
    std::string key, word;
    if (!(words >> key) || key.starts_with("#")) continue;
    const std::string where = path + ":" + std::to_string(no) + ": ";
    if (key == "delay_ns" || key == "delay_us") {
      int64_t v = 0;
      const int64_t scale = key == "delay_us" ? 1000 : 1;
      if (!(words >> word) || !parse_int(word, v) || v < 0 || v > 10'000'000'000 / scale ||
          words >> word) {
        why = where + key + " needs one number of 0..10 s";
        return false;
      }
      next.delay_ns = v * scale;
    } else if (key == "down") {
      while (words >> word) {
        int64_t i = -1;
        if (!parse_int(word, i) || i < 0 || i >= static_cast<int64_t>(devices)) {
          why = where + "'" + word + "' is not a device index 0.." + std::to_string(devices - 1);
          return false;
        }
        next.down[static_cast<size_t>(i)] = true;
      }
    } else {
      why = where + "unknown setting '" + key + "'";
      return false;
    }
  }
  if (in.bad()) {
    why = "reading " + path + " failed";
    return false;
  }
  c = std::move(next);
  return true;
}

struct Counters {
  uint64_t forwarded = 0, forwarded_bytes = 0;
  uint64_t not_ipv4 = 0, not_a_host = 0, pool_full = 0, link_down = 0, truncated = 0;
  size_t max_queue = 0, max_queue_bytes = 0;
  uint64_t late_ns_sum = 0;  // how long after its time each forwarded packet was written
  int64_t late_ns_max = 0;
};

class Switch {
 public:
  explicit Switch(const Options& o)
      : o_(o),
        hdr_(o.offload ? kVnetHdr : 0),
        // Offload: up to a 64 KiB segment (IPv4 total length) after the header; else one MTU.
        max_packet_(hdr_ + (o.offload ? 65535 : static_cast<size_t>(o.mtu))),
        pool_(static_cast<size_t>(o.pool_mib) << 20),
        scratch_(max_packet_ + 1) {
    control_.down.assign(o.devices.size(), false);
    control_.delay_ns = o.delay_ns;
  }

  // Blocks the signals it handles (then read from a signalfd), makes the devices.
  void open_devices() {
    sigset_t sigs;
    sigemptyset(&sigs);
    for (int s : {SIGHUP, SIGTERM, SIGINT}) sigaddset(&sigs, s);
    if (sigprocmask(SIG_BLOCK, &sigs, nullptr) != 0) fail("sigprocmask");
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) fail("signal(SIGPIPE)");
    sigfd_ = signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sigfd_ < 0) fail("signalfd");
    if (prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL) != 0) fail("prctl(PR_SET_TIMERSLACK)");

    const int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);  // for the interface ioctls
    if (sock < 0) fail("socket(AF_INET) for the interface settings");
    for (const std::string& name : o_.devices) {
      const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) fail("open(/dev/net/tun)");
      ifreq ifr{};
      std::memcpy(ifr.ifr_name, name.c_str(), name.size() + 1);
      ifr.ifr_flags = IFF_TUN | IFF_NO_PI | (o_.offload ? IFF_VNET_HDR : 0);
      if (ioctl(fd, TUNSETIFF, &ifr) != 0) fail("ioctl(TUNSETIFF) for " + name);
      if (std::strcmp(ifr.ifr_name, name.c_str()) != 0) {
        errno = EEXIST;
        fail("ioctl(TUNSETIFF) for " + name + " (got " + ifr.ifr_name + ")");
      }
      if (o_.offload) {
        int size = static_cast<int>(hdr_);
        if (ioctl(fd, TUNSETVNETHDRSZ, &size) != 0) fail("ioctl(TUNSETVNETHDRSZ) for " + name);
        if (ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6) != 0)
          fail("ioctl(TUNSETOFFLOAD) for " + name);
      }
      ifreq set{};
      std::memcpy(set.ifr_name, name.c_str(), name.size() + 1);
      set.ifr_mtu = o_.mtu;
      if (ioctl(sock, SIOCSIFMTU, &set) != 0) fail("ioctl(SIOCSIFMTU) for " + name);
      set.ifr_qlen = o_.txqueuelen;
      if (ioctl(sock, SIOCSIFTXQLEN, &set) != 0) fail("ioctl(SIOCSIFTXQLEN) for " + name);
      fds_.push_back(fd);
    }
    if (close(sock) != 0) fail("close");
    if (!o_.control.empty()) reload();
  }

  // Forwards until SIGTERM or SIGINT; returns the exit status.
  int run() {
    const size_t n = fds_.size();
    std::vector<pollfd> pfd(n + 1);
    for (size_t i = 0; i < n; ++i) pfd[i] = {fds_[i], POLLIN, 0};
    pfd[n] = {sigfd_, POLLIN, 0};
    for (;;) {
      timespec timeout{};
      timespec* wait = nullptr;  // nothing queued: until a packet or a signal comes
      int64_t asked = 0;         // when the timeout should end
      if (!pool_.empty()) {
        const int64_t now = now_ns();
        const int64_t left = pool_.front().read_ns + control_.delay_ns - now;
        if (left <= 0) {
          release();
          continue;
        }
        // Asked to wake `advance_ns_` early, the timer's usual lateness: then the release falls
        // close to its time, and not before it (an early wake sleeps the rest).
        const int64_t sleep = left > advance_ns_ ? left - advance_ns_ : left;
        asked = now + sleep;
        timeout = {static_cast<time_t>(sleep / 1'000'000'000),
                   static_cast<long>(sleep % 1'000'000'000)};
        wait = &timeout;
      }
      const int ready = ppoll(pfd.data(), pfd.size(), wait, nullptr);
      if (ready < 0) {
        if (errno == EINTR) continue;
        fail("ppoll");
      }
      if (ready == 0) timer_woke(now_ns() - asked);
      if (pfd[n].revents != 0 && !signals()) return 0;
      for (size_t i = 0; i < n; ++i) {
        if (pfd[i].revents == 0) continue;
        if (pfd[i].revents & (POLLERR | POLLNVAL)) {
          errno = EIO;
          fail("poll on " + o_.devices[i] + " (device gone?)");
        }
        drain(i);
        release();
      }
      release();
    }
  }

 private:
  // The timer woke the loop `late` ns after it asked: the least lateness of each window of 64
  // such wakes becomes the advance of the next (a few us on a machine, tens in a VM).
  void timer_woke(int64_t late) {
    window_min_ = std::min(window_min_, late);
    if (++window_wakes_ < 64) return;
    advance_ns_ = std::clamp<int64_t>(window_min_, 0, 1'000'000);
    window_min_ = INT64_MAX;
    window_wakes_ = 0;
  }

  // Reads device i until it has nothing more or after a batch (a busy device then delays the
  // releases by one batch at most), queueing each packet for its destination.
  void drain(size_t i) {
    for (int k = 0; k < 64; ++k) {
      // One byte more than the longest packet: a read that fills it all was cut short.
      unsigned char* slot = pool_.reserve(max_packet_ + 1);
      unsigned char* into = slot ? slot : scratch_.data();
      const ssize_t got = read(fds_[i], into, max_packet_ + 1);
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        fail("read from " + o_.devices[i]);
      }
      const int64_t t = now_ns();
      const size_t len = static_cast<size_t>(got);
      if (!slot) {  // pool full
        ++counters_.pool_full;
        continue;
      }
      if (len > max_packet_) {
        ++counters_.truncated;
        continue;
      }
      if (control_.down[i]) {
        ++counters_.link_down;
        continue;
      }
      const unsigned char* ip = into + hdr_;
      if (len < hdr_ + 20 || (ip[0] >> 4) != 4) {
        ++counters_.not_ipv4;
        continue;
      }
      uint32_t dst = 0;
      std::memcpy(&dst, ip + 16, 4);
      dst = ntohl(dst);
      const uint32_t host = dst & 0xff;
      if ((dst & 0xffffff00) != o_.subnet || host < 1 || host > fds_.size()) {
        ++counters_.not_a_host;
        continue;
      }
      pool_.commit({t, static_cast<uint32_t>(len), static_cast<uint16_t>(i),
                    static_cast<uint16_t>(host - 1)});
      if (pool_.count() > counters_.max_queue) counters_.max_queue = pool_.count();
      if (pool_.bytes() > counters_.max_queue_bytes) counters_.max_queue_bytes = pool_.bytes();
    }
  }

  // Writes out every queued packet whose delay has passed, in order.
  void release() {
    if (pool_.empty()) return;
    const int64_t now = now_ns();
    while (!pool_.empty()) {
      const Pool::Header h = pool_.front();
      if (h.read_ns + control_.delay_ns > now) return;
      if (control_.down[h.to]) {
        ++counters_.link_down;
      } else {
        const ssize_t put = write(fds_[h.to], pool_.front_data(), h.len);
        if (put == static_cast<ssize_t>(h.len)) {
          ++counters_.forwarded;
          counters_.forwarded_bytes += h.len;
          const int64_t late = now - (h.read_ns + control_.delay_ns);
          counters_.late_ns_sum += static_cast<uint64_t>(late);
          counters_.late_ns_max = std::max(counters_.late_ns_max, late);
        } else if (put < 0 && (errno == EIO || errno == EAGAIN || errno == ENOBUFS)) {
          ++counters_.link_down;  // the host's interface is down (EIO), or no memory now
        } else {
          if (put >= 0) errno = EMSGSIZE;
          fail("write to " + o_.devices[h.to]);
        }
      }
      pool_.pop();
    }
  }

  // Handles the pending signals; false on SIGTERM or SIGINT (after printing the counters).
  bool signals() {
    signalfd_siginfo si{};
    for (;;) {
      const ssize_t got = read(sigfd_, &si, sizeof si);
      if (got < 0) {
        if (errno == EAGAIN) return true;
        if (errno == EINTR) continue;
        fail("read from the signalfd");
      }
      if (si.ssi_signo == SIGHUP) {
        reload();
        continue;
      }
      const Counters& c = counters_;
      std::fprintf(stderr,
                   "netdelay: forwarded %llu packets (%llu bytes); dropped %llu not IPv4, %llu not "
                   "to a host, %llu pool full, %llu link down, %llu too long; longest queue %zu "
                   "packets (%zu bytes); written %.1f us after their time on average (at most "
                   "%.1f us; the timer asked %.1f us early)\n",
                   static_cast<unsigned long long>(c.forwarded),
                   static_cast<unsigned long long>(c.forwarded_bytes),
                   static_cast<unsigned long long>(c.not_ipv4),
                   static_cast<unsigned long long>(c.not_a_host),
                   static_cast<unsigned long long>(c.pool_full),
                   static_cast<unsigned long long>(c.link_down),
                   static_cast<unsigned long long>(c.truncated), c.max_queue, c.max_queue_bytes,
                   c.forwarded ? static_cast<double>(c.late_ns_sum) / c.forwarded / 1e3 : 0.0,
                   static_cast<double>(c.late_ns_max) / 1e3,
                   static_cast<double>(advance_ns_) / 1e3);
      return false;
    }
  }

  // Re-reads the control file; applies the delay and each device's carrier.
  void reload() {
    std::string why;
    if (!read_control(o_.control, fds_.size(), control_, why)) {
      std::fprintf(stderr, "netdelay: %s; settings unchanged\n", why.c_str());
      return;
    }
    std::string down;
    for (size_t i = 0; i < fds_.size(); ++i) {
      int carrier = control_.down[i] ? 0 : 1;
      if (ioctl(fds_[i], TUNSETCARRIER, &carrier) != 0)
        fail("ioctl(TUNSETCARRIER) for " + o_.devices[i]);
      if (control_.down[i]) down.append(" ").append(std::to_string(i));
    }
    std::fprintf(stderr, "netdelay: applied delay_ns %lld, down:%s\n",
                 static_cast<long long>(control_.delay_ns), down.empty() ? " -" : down.c_str());
  }

  const Options& o_;
  const size_t hdr_;         // bytes of virtio_net_hdr before each packet (0 without offload)
  const size_t max_packet_;  // the most one read returns
  Pool pool_;
  std::vector<unsigned char> scratch_;  // where packets go that the full pool cannot take
  std::vector<int> fds_;
  int sigfd_ = -1;
  Control control_;
  Counters counters_;
  int64_t advance_ns_ = 0;  // how early to ask the timer for a release
  int64_t window_min_ = INT64_MAX;
  int window_wakes_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  Switch sw(o);
  sw.open_devices();
  if (std::printf("ready\n") < 0 || std::fflush(stdout) != 0) fail("writing 'ready' to stdout");
  return sw.run();
}
