//go:build linux

package cabi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// mpiRun is one run of testdata/mpipingpong.c: ranks processes (each with a device of its own),
// ping-pongs between ranks 0 and 1 at sizes minSize, 4·minSize, … up to maxSize (iters round
// trips up to 4 KiB, fewer above), every byte checked, then a checked allreduce over every rank.
type mpiRun struct {
	libfabric               string // "1.17" (Debian's) or "2.6" (the stack's, by LD_LIBRARY_PATH)
	ranks                   int
	iters, minSize, maxSize int
}

// sweep is the size sweep every MPI runs on 2 and 4 ranks with both libfabrics: 1 B to 4 MiB,
// 1000 round trips up to 4 KiB with libfabric 1.17 and 200 with 2.6, whose raw-ring data path
// takes about a millisecond a round trip here (docs/cabi.md).
func sweep(libfabric string, ranks int) mpiRun {
	iters := 1000
	if libfabric == "2.6" {
		iters = 200
	}
	return mpiRun{libfabric: libfabric, ranks: ranks, iters: iters, minSize: 1, maxSize: 4 << 20}
}

func (r mpiRun) String() string {
	return fmt.Sprintf("libfabric %s, %d ranks, %d×%d..%d B", r.libfabric, r.ranks, r.iters, r.minSize, r.maxSize)
}

// args are mpipingpong's arguments.
func (r mpiRun) args() []string {
	return []string{fmt.Sprint(r.iters), fmt.Sprint(r.minSize), fmt.Sprint(r.maxSize)}
}

// check fails t unless out (rank 0's report) has an ok line for every size and for the
// allreduce, and no BAD one; it logs the lines.
func (r mpiRun) check(t *testing.T, out string) {
	t.Helper()
	var want []string
	for size := r.minSize; size <= r.maxSize; size *= 4 {
		n := r.iters
		if size > 4096 {
			n = max(10, r.iters*4096/size)
		}
		want = append(want, fmt.Sprintf("ok %d round trips of %d B, ", n, size))
	}
	want = append(want, fmt.Sprintf("ok allreduce of 262144 ints over %d ranks, 0 bad", r.ranks))
	for _, w := range want {
		if !strings.Contains(out, w) || strings.Contains(out, "BAD") {
			t.Fatalf("want %q and no BAD:\n%s", w, lastLines(out, 60))
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "ok ") {
			t.Log(l)
		}
	}
}

// buildMPI compiles testdata/mpipingpong.c with the MPI compiler wrapper mpicc.
func buildMPI(t *testing.T, mpicc string) string {
	t.Helper()
	src, err := filepath.Abs(filepath.Join("testdata", "mpipingpong.c"))
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), "mpipingpong")
	if out, err := exec.Command(mpicc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", exe, src).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", mpicc, err, out)
	}
	return exe
}

// TestOpenMPI runs testdata/mpipingpong.c under Debian's Open MPI 4.1 with libfabric's efa provider
// (`--mca pml cm --mca mtl ofi`, efa only), each rank a process with a device of its own; every
// rank must report that it chose efa_0-rdm. The size sweep (1 B to 4 MiB) runs on 2 and 4 ranks
// with Debian's libfabric 1.17 and with libfabric 2.6 from cabi/thirdparty/build.sh (its own
// direct data path); besides, 20,000 one-byte round trips on 2 and 4 ranks with 1.17 (Open MPI
// hung after about 3,000 while CQs stalled on their wrap) and 5,000 with 2.6.
func TestOpenMPI(t *testing.T) {
	if testing.Short() {
		t.Skip("runs MPI jobs")
	}
	s := setupOrSkip(t, "mpicc", "mpirun")
	exe := buildMPI(t, "mpicc")
	runs := []mpiRun{
		{"1.17", 2, 20000, 1, 1}, {"1.17", 4, 20000, 1, 1}, {"2.6", 2, 5000, 1, 1},
		sweep("1.17", 2), sweep("1.17", 4), sweep("2.6", 2), sweep("2.6", 4),
	}
	for _, r := range runs {
		t.Run(r.String(), func(t *testing.T) {
			args := []string{"--allow-run-as-root", "--oversubscribe", "-np", fmt.Sprint(r.ranks),
				"--mca", "pml", "cm", "--mca", "mtl", "ofi", "--mca", "mtl_ofi_provider_include", "efa",
				"--mca", "mtl_base_verbose", "10"}
			if r.libfabric == "2.6" {
				args = append(args, "-x", "LD_LIBRARY_PATH="+filepath.Join(stackPrefix(t), "lib"))
			}
			out := run(t, s, "", 5*time.Minute, "mpirun", append(append(args, exe), r.args()...)...)
			if n := strings.Count(out, "mtl:ofi:provider: efa_0-rdm"); n != r.ranks {
				t.Fatalf("%d of %d ranks report efa_0-rdm:\n%s", n, r.ranks, lastLines(out, 40))
			}
			r.check(t, out)
		})
	}
}

// mpichPrefix returns MPICH's prefix: $SOFTEFA_MPICH, or the one cabi/thirdparty/mpich.sh
// --prefix names. Without a built MPICH the test skips, unless SOFTEFA_REQUIRE_STACK=1 (CI).
func mpichPrefix(t *testing.T) string {
	t.Helper()
	p := os.Getenv("SOFTEFA_MPICH")
	if p == "" {
		out, err := exec.Command("bash", filepath.Join("thirdparty", "mpich.sh"), "--prefix").Output()
		p = strings.TrimSpace(string(out))
		if err != nil {
			p = ""
		}
	}
	if _, err := os.Stat(filepath.Join(p, ".complete")); p == "" || err != nil {
		msg := fmt.Sprintf("MPICH (ch4:ofi) is not built (%q): run cabi/thirdparty/mpich.sh", p)
		if os.Getenv("SOFTEFA_REQUIRE_STACK") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

// TestMPICH runs testdata/mpipingpong.c under MPICH 4.0.2 built with ch4:ofi (Debian 12's mpich
// is ch4:ucx only; cabi/thirdparty/mpich.sh builds Debian's source with libfabric), with no
// shared-memory module, so every rank talks through libfabric, and FI_PROVIDER=efa, so that
// libfabric offers nothing else: a rank that passes MPI_Init uses the efa provider, and rank 0's
// debug summary must name it. The size sweep runs on 2 and 4 ranks with Debian's libfabric 1.17
// and with libfabric 2.6 from cabi/thirdparty/build.sh.
func TestMPICH(t *testing.T) {
	if testing.Short() {
		t.Skip("runs MPI jobs")
	}
	m := mpichPrefix(t)
	s := setupOrSkip(t)
	exe := buildMPI(t, filepath.Join(m, "bin", "mpicc"))
	for _, r := range []mpiRun{sweep("1.17", 2), sweep("1.17", 4), sweep("2.6", 2), sweep("2.6", 4)} {
		t.Run(r.String(), func(t *testing.T) {
			args := []string{"-launcher", "fork", "-n", fmt.Sprint(r.ranks),
				"-env", "FI_PROVIDER", "efa", "-env", "MPIR_CVAR_DEBUG_SUMMARY", "1"}
			if r.libfabric == "2.6" {
				args = append(args, "-env", "LD_LIBRARY_PATH", filepath.Join(stackPrefix(t), "lib"))
			}
			out := run(t, s, "", 5*time.Minute, filepath.Join(m, "bin", "mpiexec"), append(append(args, exe), r.args()...)...)
			if !strings.Contains(out, "libfabric provider: efa - ") {
				t.Fatalf("MPICH's summary does not name the efa provider:\n%s", lastLines(out, 60))
			}
			r.check(t, out)
		})
	}
}
