//go:build linux

package cabi

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPruneKeepsBuildsInUse: prune keeps the newest builds and any build a process holds, however
// old, and removes the rest (a long test suite's build was pruned under it by a build of other
// sources, and its next program could not load the shim).
func TestPruneKeepsBuildsInUse(t *testing.T) {
	cache := t.TempDir()
	now := time.Now()
	for i, name := range []string{"held", "old", "newest"} {
		d := filepath.Join(cache, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		mod := now.Add(time.Duration(i) * time.Hour)
		if err := os.Chtimes(d, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	if err := holdBuild(filepath.Join(cache, "held")); err != nil {
		t.Fatal(err)
	}
	// holdBuild made the directory's in-use file, which moved its time: set it back.
	if err := os.Chtimes(filepath.Join(cache, "held"), now, now); err != nil {
		t.Fatal(err)
	}
	prune(cache, 1)
	for name, want := range map[string]bool{"held": true, "old": false, "newest": true} {
		if _, err := os.Stat(filepath.Join(cache, name)); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", name, err == nil, want)
		}
	}
	if err := holdBuild(filepath.Join(cache, "held")); err != nil { // again: the same file, still held
		t.Fatal(err)
	}
}
