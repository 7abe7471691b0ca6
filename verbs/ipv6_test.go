package verbs_test

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/verbs"
)

// SRD over IPv6: an IPv6 device's GID is its address, and every device uses the configured port.
// Two addresses on one host need a network namespace of the test's own (root only); the inner
// test runs in it.

const v6Env = "SOFTEFA_TEST_V6"

func TestIPv6(t *testing.T) {
	if os.Getenv(v6Env) != "" {
		t.Skip("the child runs TestIPv6Inner")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a network namespace with two IPv6 addresses")
	}
	ns := fmt.Sprintf("softefa-v6-%d", os.Getpid())
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	run("netns", "add", ns)
	defer exec.Command("ip", "netns", "del", ns).Run()
	run("-n", ns, "link", "set", "lo", "up")
	run("-n", ns, "addr", "add", "fd00::1/128", "dev", "lo", "nodad")
	run("-n", ns, "addr", "add", "fd00::2/128", "dev", "lo", "nodad")
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestIPv6Inner$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), v6Env+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("inner test: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

func TestIPv6Inner(t *testing.T) {
	if os.Getenv(v6Env) == "" {
		t.Skip("runs inside TestIPv6's namespace")
	}
	a, b := newRemotePair(t, config.Device{Addr: netip.MustParseAddrPort("[fd00::1]:4791")},
		config.Device{Addr: netip.MustParseAddrPort("[fd00::2]:4791")}, loopOpts{size: 1 << 20,
			access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead})
	if g := b.ctx.Device().GID(); g != verbs.GID(netip.MustParseAddr("fd00::2").As16()) {
		t.Fatalf("IPv6 GID %v", g)
	}
	exchange(t, a, b, 20, 8192, 256<<10, 7)
}
