//go:build linux

package cabi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// archiveTree is a copy of cabi/thirdparty's scripts in a directory laid out as a clone beside
// ../shared/thirdparty, with fake archives whose sums stand in SHA256SUMS, a fake curl first on
// PATH, and a cache of its own.
type archiveTree struct {
	t                           *testing.T
	scripts, shared, env, cache string
	curlLog                     string
	env0                        []string
}

const fakeArchive = "rdma-core-64.0.tar.gz"

func newArchiveTree(t *testing.T, curl string) *archiveTree {
	t.Helper()
	root := t.TempDir()
	a := &archiveTree{t: t,
		scripts: filepath.Join(root, "clone", "cabi", "thirdparty"),
		shared:  filepath.Join(root, "shared", "thirdparty"),
		env:     filepath.Join(root, "env"),
		cache:   filepath.Join(root, "cache"),
		curlLog: filepath.Join(root, "curl.log"),
	}
	for _, d := range []string{a.scripts, a.shared, a.env, filepath.Join(root, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"archives.sh", "build.sh"} {
		b, err := os.ReadFile(filepath.Join("thirdparty", f))
		if err != nil {
			t.Fatal(err)
		}
		a.write(filepath.Join(a.scripts, f), string(b))
	}
	sum := sha256.Sum256([]byte("good"))
	a.write(filepath.Join(a.scripts, "SHA256SUMS"), hex.EncodeToString(sum[:])+"  "+fakeArchive+"\n")
	// curl -fsSL ... -o FILE URL: logs the URL, then runs the case's body with $out and $url.
	a.write(filepath.Join(root, "bin", "curl"), `#!/bin/bash
while [ $# -gt 1 ]; do [ "$1" = -o ] && out=$2; shift; done
url=$1
echo "$url" >>`+a.curlLog+`
`+curl+"\n")
	if err := os.Chmod(filepath.Join(root, "bin", "curl"), 0o755); err != nil {
		t.Fatal(err)
	}
	a.env0 = []string{"PATH=" + filepath.Join(root, "bin") + ":" + os.Getenv("PATH"),
		"HOME=" + root, "SOFTEFA_STACK_CACHE=" + a.cache}
	return a
}

func (a *archiveTree) write(path, s string) {
	a.t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		a.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		a.t.Fatal(err)
	}
}

// run runs archives.sh's function fn on the fake archive with the extra environment env and
// returns its stdout, its stderr and whether it succeeded.
func (a *archiveTree) run(fn string, env ...string) (string, string, bool) {
	a.t.Helper()
	cmd := exec.Command("bash", "-c", `set -u; . "$0"; `+fn+` "$1" "${2:-}"`,
		filepath.Join(a.scripts, "archives.sh"), fakeArchive)
	cmd.Env = append(append([]string{}, a.env0...), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return strings.TrimSpace(out.String()), errb.String(), err == nil
}

func (a *archiveTree) curled() string {
	b, _ := os.ReadFile(a.curlLog)
	return strings.TrimSpace(string(b))
}

const rdmaCoreURL = "https://github.com/linux-rdma/rdma-core/archive/refs/tags/v64.0.tar.gz"

// The order archives.sh looks for an archive in: a directory the script names, then
// SOFTEFA_THIRDPARTY, then ../shared/thirdparty beside the clone, then earlier downloads, then the
// project's release page; the first copy found is checked, and a bad one is an error.
func TestArchiveLookupOrder(t *testing.T) {
	a := newArchiveTree(t, `exit 7`)
	inCache := filepath.Join(a.cache, "archives", fakeArchive)
	extra := filepath.Join(filepath.Dir(a.env), "extra")
	for _, p := range []string{filepath.Join(a.env, fakeArchive), filepath.Join(a.shared, fakeArchive),
		inCache, filepath.Join(extra, fakeArchive)} {
		a.write(p, "good")
	}
	envVar := "SOFTEFA_THIRDPARTY=" + a.env
	steps := []struct {
		what   string
		env    []string
		remove string // removed before the step
		want   string
	}{
		{"a directory the script names comes first", []string{envVar, "EXTRA=" + extra}, "", filepath.Join(extra, fakeArchive)},
		{"SOFTEFA_THIRDPARTY comes before ../shared/thirdparty", []string{envVar}, filepath.Join(extra, fakeArchive), filepath.Join(a.env, fakeArchive)},
		{"../shared/thirdparty without SOFTEFA_THIRDPARTY", nil, "", filepath.Join(a.shared, fakeArchive)},
		{"../shared/thirdparty when SOFTEFA_THIRDPARTY lacks it", []string{envVar}, filepath.Join(a.env, fakeArchive), filepath.Join(a.shared, fakeArchive)},
		{"an earlier download", []string{envVar}, filepath.Join(a.shared, fakeArchive), inCache},
		{"the release page", []string{envVar}, inCache, "download " + rdmaCoreURL},
	}
	for _, s := range steps {
		if s.remove != "" {
			if err := os.Remove(s.remove); err != nil {
				t.Fatal(err)
			}
		}
		fn := func(name string) string {
			if len(s.env) == 2 { // the script's own directory, as mpich.sh passes SOFTEFA_MPICH_SRC
				return `f() { ` + name + ` "$1" "$EXTRA"; }; f`
			}
			return name
		}
		got, stderr, ok := a.run(fn("archive_source"), s.env...)
		if !ok || got != s.want {
			t.Fatalf("%s: archive_source printed %q (ok %v), want %q; stderr:\n%s", s.what, got, ok, s.want, stderr)
		}
		if !strings.HasPrefix(s.want, "download ") {
			if got, stderr, ok := a.run(fn("archive_get"), s.env...); !ok || got != s.want {
				t.Fatalf("%s: archive_get printed %q (ok %v), want %q; stderr:\n%s", s.what, got, ok, s.want, stderr)
			}
		}
	}
	if c := a.curled(); c != "" {
		t.Fatalf("downloaded %q with a copy at hand", c)
	}

	// A bad copy where the lookup stops is refused, though a good one lies further on.
	a.write(filepath.Join(a.env, fakeArchive), "bad")
	a.write(filepath.Join(a.shared, fakeArchive), "good")
	if got, stderr, ok := a.run("archive_get", envVar); ok || !strings.Contains(stderr, "checksum mismatch") {
		t.Fatalf("a bad copy in SOFTEFA_THIRDPARTY: printed %q, ok %v, stderr:\n%s", got, ok, stderr)
	}
}

// With no copy anywhere, archive_get downloads the archive from the project's release page into
// the cache, and keeps it only if it has its sum; a failed download says where to put the archive.
func TestArchiveDownload(t *testing.T) {
	for _, c := range []struct {
		what, curl string
		ok         bool
		stderr     string
	}{
		{"download", `printf good >"$out"`, true, ""},
		{"no network", `echo "curl: (6) Could not resolve host: github.com" >&2; exit 6`, false,
			"the download failed: curl: (6) Could not resolve host: github.com"},
		{"another archive", `printf regenerated >"$out"`, false, "checksum mismatch"},
	} {
		a := newArchiveTree(t, c.curl)
		env := "SOFTEFA_THIRDPARTY=" + a.env
		got, stderr, ok := a.run("archive_get", env)
		if ok != c.ok || !strings.Contains(stderr, c.stderr) {
			t.Fatalf("%s: printed %q, ok %v (want %v), stderr (want %q):\n%s", c.what, got, ok, c.ok, c.stderr, stderr)
		}
		if u := a.curled(); u != rdmaCoreURL {
			t.Fatalf("%s: curl fetched %q, want %s", c.what, u, rdmaCoreURL)
		}
		kept, _ := filepath.Glob(filepath.Join(a.cache, "archives", "*"))
		hidden, _ := filepath.Glob(filepath.Join(a.cache, "archives", ".*"))
		kept = append(kept, hidden...)
		want := []string{}
		if c.ok {
			want = []string{filepath.Join(a.cache, "archives", fakeArchive)}
			if got != want[0] {
				t.Fatalf("%s: printed %q, want %s", c.what, got, want[0])
			}
			if b, _ := os.ReadFile(got); string(b) != "good" {
				t.Fatalf("%s: kept %q", c.what, b)
			}
		} else {
			for _, d := range []string{a.env, a.shared, filepath.Join(a.cache, "archives")} {
				if !strings.Contains(stderr, d) {
					t.Fatalf("%s: the message does not name %s:\n%s", c.what, d, stderr)
				}
			}
		}
		if fmt.Sprint(kept) != fmt.Sprint(want) {
			t.Fatalf("%s: the cache holds %v, want %v", c.what, kept, want)
		}
		// A second call finds the download and fetches nothing more.
		if c.ok {
			if again, stderr, ok := a.run("archive_get", env); !ok || again != got || a.curled() != rdmaCoreURL {
				t.Fatalf("second call: %q, ok %v, curl %q; stderr:\n%s", again, ok, a.curled(), stderr)
			}
		}
	}
}

// build.sh's cache key hashes rdma-core's and libfabric's sums alone: the lines SHA256SUMS gained
// for other scripts' archives leave it, and so every build cached before them, where it was.
func TestStackKeyIgnoresOtherArchives(t *testing.T) {
	a := newArchiveTree(t, `exit 7`)
	sums, err := os.ReadFile(filepath.Join("thirdparty", "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	prefix := func(sums string) string {
		t.Helper()
		a.write(filepath.Join(a.scripts, "SHA256SUMS"), sums)
		cmd := exec.Command("bash", filepath.Join(a.scripts, "build.sh"), "--prefix")
		cmd.Env = a.env0
		out, _ := cmd.Output() // exit status 1: not built
		return strings.TrimSpace(string(out))
	}
	var own []string
	for _, l := range strings.SplitAfter(string(sums), "\n") {
		if strings.HasSuffix(l, "  rdma-core-64.0.tar.gz\n") || strings.HasSuffix(l, "  libfabric-2.6.0.tar.gz\n") {
			own = append(own, l)
		}
	}
	if len(own) != 2 {
		t.Fatalf("SHA256SUMS has %d lines for rdma-core and libfabric:\n%s", len(own), sums)
	}
	all, alone := prefix(string(sums)), prefix(strings.Join(own, ""))
	if all == "" || all != alone {
		t.Fatalf("prefix %q with SHA256SUMS as it is, %q with rdma-core's and libfabric's lines alone", all, alone)
	}
}
