//go:build linux

package cabi

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
)

// Library file names in a build directory.
const (
	ShimLib   = "softefa_preload.so"
	EngineLib = "libsoftefa.so"
)

const modulePath = "github.com/softefa/softefa"

// Libs are the two libraries a program needs.
type Libs struct {
	Shim, Engine string
}

// FindSource returns the root of softefa's source tree: src when it is given (an error when it
// is not softefa's), else the first directory holding softefa's go.mod above the working
// directory or the running executable.
func FindSource(src string) (string, error) {
	if src != "" {
		if isRoot(src) {
			return src, nil
		}
		return "", fmt.Errorf("cabi: %s is not softefa's source tree", src)
	}
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	for _, d := range starts {
		for {
			if isRoot(d) {
				return d, nil
			}
			up := filepath.Dir(d)
			if up == d {
				break
			}
			d = up
		}
	}
	return "", errors.New("cabi: softefa's source tree not found (softefa run --src, or --libdir for prebuilt libraries)")
}

func isRoot(d string) bool {
	b, err := os.ReadFile(filepath.Join(d, "go.mod"))
	return err == nil && bytes.HasPrefix(b, []byte("module "+modulePath+"\n"))
}

// Where says where the libraries come from (softefa run's --src, --libdir and --cache).
type Where struct {
	Src    string // softefa's source tree to build from (default: FindSource's search)
	LibDir string // prebuilt ShimLib and EngineLib: used as they are, nothing is built
	Cache  string // where builds are cached (default: the user cache dir, softefa/cabi)
}

// Locate returns the libraries: those in w.LibDir if set, otherwise a build from the source tree
// cached under w.Cache and keyed by a hash of the sources and the Go and C compilers, built with
// go and cc when missing. Progress goes to log.
func Locate(log io.Writer, w Where) (Libs, error) { return LocateFrom(log, nil, w) }

// LocateFrom is Locate with a fallback: when no source tree is found (a softefa installed with go
// install, run outside any checkout) and w.Src is not set, the sources in embedded (the root
// package's Source) are written to the cache, under a directory named by their hash, and built
// from there. Building needs go, cc and the module's dependencies in the module cache (go install
// put them there).
func LocateFrom(log io.Writer, embedded fs.FS, w Where) (Libs, error) {
	if d := w.LibDir; d != "" {
		l := Libs{Shim: filepath.Join(d, ShimLib), Engine: filepath.Join(d, EngineLib)}
		for _, p := range []string{l.Shim, l.Engine} {
			if _, err := os.Stat(p); err != nil {
				return Libs{}, fmt.Errorf("cabi: prebuilt libraries: %w", err)
			}
		}
		return l, nil
	}
	cache := w.Cache
	if cache == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return Libs{}, err
		}
		cache = filepath.Join(base, "softefa", "cabi")
	}
	src, err := FindSource(w.Src)
	if err != nil && embedded != nil && w.Src == "" {
		src, err = extract(embedded, filepath.Join(cache, "src"))
	}
	if err != nil {
		return Libs{}, err
	}
	return Build(src, cache, log)
}

// extract writes the files of embedded into dir/<hash of them> (once: a later call finds them)
// and returns that directory.
func extract(embedded fs.FS, dir string) (string, error) {
	h := sha256.New()
	var files []string
	err := fs.WalkDir(embedded, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(embedded, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", p, len(b))
		h.Write(b)
		files = append(files, p)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("cabi: embedded sources: %w", err)
	}
	if len(files) == 0 {
		return "", errors.New("cabi: no embedded sources")
	}
	dst := filepath.Join(dir, hex.EncodeToString(h.Sum(nil))[:16])
	if isRoot(dst) {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, p := range files {
		b, err := fs.ReadFile(embedded, p)
		if err != nil {
			return "", err
		}
		out := filepath.Join(tmp, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(out, b, 0o644); err != nil {
			return "", err
		}
	}
	if err := os.Rename(tmp, dst); err != nil && !isRoot(dst) { // another process may have won
		return "", err
	}
	return dst, nil
}

// Build builds the libraries from the source tree src into a directory of cache named by the
// sources' hash, unless that directory already holds them. Concurrent builds are serialized with
// a lock file.
func Build(src, cache string, log io.Writer) (Libs, error) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	for _, tool := range []string{"go", cc} {
		if _, err := exec.LookPath(tool); err != nil {
			return Libs{}, fmt.Errorf("cabi: building the libraries needs %s: %w", tool, err)
		}
	}
	goVer, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		return Libs{}, fmt.Errorf("cabi: go env GOVERSION: %w", err)
	}
	ccVer, _ := exec.Command(cc, "--version").Output()
	key, err := sourceHash(src, string(goVer)+string(ccVer))
	if err != nil {
		return Libs{}, err
	}
	dir := filepath.Join(cache, key[:16])
	libs := Libs{Shim: filepath.Join(dir, ShimLib), Engine: filepath.Join(dir, EngineLib)}
	if holdBuild(dir) == nil && built(libs) {
		return libs, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return Libs{}, err
	}
	lock, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return Libs{}, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return Libs{}, err
	}
	if holdBuild(dir) == nil && built(libs) { // built while we waited
		return libs, nil
	}
	tmp, err := os.MkdirTemp(cache, "build-")
	if err != nil {
		return Libs{}, err
	}
	defer os.RemoveAll(tmp)
	fmt.Fprintf(log, "softefa: building the preload shim and the engine library into %s\n", dir)
	steps := []*exec.Cmd{
		exec.Command(cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", filepath.Join(tmp, ShimLib),
			filepath.Join(src, "cabi", "shim", "preload.c"), filepath.Join(src, "cabi", "shim", "dbtrap.c"),
			filepath.Join(src, "cabi", "shim", "paths.c"), filepath.Join(src, "cabi", "shim", "hostdev.c"),
			filepath.Join(src, "cabi", "shim", "conf.c"), "-ldl", "-lpthread"),
		exec.Command("go", "build", "-buildmode=c-shared", "-o", filepath.Join(tmp, EngineLib), "./cabi/libengine"),
	}
	for _, c := range steps {
		c.Dir = src
		c.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := c.CombinedOutput(); err != nil {
			return Libs{}, fmt.Errorf("cabi: %s: %w\n%s", strings.Join(c.Args, " "), err, out)
		}
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return Libs{}, err
	}
	if err := holdBuild(dir); err != nil {
		return Libs{}, err
	}
	prune(cache, keepBuilds)
	return libs, nil
}

// keepBuilds is how many builds the cache keeps besides those in use: each source change makes
// a new one.
const keepBuilds = 4

// inUseFile, in a build directory, is locked shared by every process that uses the build
// (holdBuild), for as long as it runs: softefa run, or a test binary, starts programs that load
// the libraries long after it located them (a test suite for half an hour), and a concurrent
// build of other sources must not prune them meanwhile.
const inUseFile = ".in-use"

var (
	heldMu sync.Mutex
	held   = map[string]*os.File{} // build directory → its in-use file, locked shared until exit
)

// holdBuild takes a shared lock on dir's in-use file and keeps it until the process exits. A
// file held before, since removed with its directory, is let go and the new one locked.
func holdBuild(dir string) error {
	heldMu.Lock()
	defer heldMu.Unlock()
	p := filepath.Join(dir, inUseFile)
	if f := held[dir]; f != nil {
		a, err1 := f.Stat()
		b, err2 := os.Stat(p)
		if err1 == nil && err2 == nil && os.SameFile(a, b) {
			return nil
		}
		f.Close()
		delete(held, dir)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		f.Close()
		return err
	}
	held[dir] = f
	return nil
}

// prune removes all but the newest keep build directories of cache, and never one that a
// process holds (holdBuild). Called with the cache's lock held; a program that mapped a removed
// build's libraries keeps them.
func prune(cache string, keep int) {
	ents, err := os.ReadDir(cache)
	if err != nil {
		return
	}
	type build struct {
		path string
		mod  int64
	}
	var builds []build
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), "build-") || strings.HasPrefix(e.Name(), ".") || e.Name() == "src" {
			continue
		}
		if info, err := e.Info(); err == nil {
			builds = append(builds, build{filepath.Join(cache, e.Name()), info.ModTime().UnixNano()})
		}
	}
	sort.Slice(builds, func(i, j int) bool { return builds[i].mod > builds[j].mod })
	for _, b := range builds[min(keep, len(builds)):] {
		f, err := os.Open(filepath.Join(b.path, inUseFile))
		if err != nil { // a build no process has held since it was made
			os.RemoveAll(b.path)
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			os.RemoveAll(b.path)
		}
		f.Close()
	}
}

func built(l Libs) bool {
	_, e1 := os.Stat(l.Shim)
	_, e2 := os.Stat(l.Engine)
	return e1 == nil && e2 == nil
}

// sourceHash hashes extra and every Go (non-test) and C file of the source tree that the
// libraries can depend on.
func sourceHash(src, extra string) (string, error) {
	h := sha256.New()
	io.WriteString(h, extra)
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != src && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bench" || name == "lab" || name == "docs") {
				return filepath.SkipDir
			}
			return nil
		}
		if !(strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") ||
			strings.HasSuffix(name, ".c") || strings.HasSuffix(name, ".h") || name == "go.mod" || name == "go.sum") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
