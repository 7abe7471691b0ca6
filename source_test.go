package softefa

import (
	"os/exec"
	"path"
	"strings"
	"testing"
)

// Every package of this module that the engine library is built from is in Source: a package
// added to the engine and left out of the embed list breaks only an installed `softefa run`
// (TestInstalledRun), so check it here, where it is cheap.
func TestSourceCoversEngineLibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./cabi/libengine").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/softefa/softefa"
	for _, pkg := range strings.Fields(string(out)) {
		if pkg != module && !strings.HasPrefix(pkg, module+"/") {
			continue
		}
		dir := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		files, err := Source.ReadDir(dir)
		if err != nil {
			t.Errorf("package %s is not in Source (add %s/*.go to its go:embed lines): %v", pkg, dir, err)
			continue
		}
		found := false
		for _, f := range files {
			found = found || path.Ext(f.Name()) == ".go"
		}
		if !found {
			t.Errorf("package %s has no Go files in Source", pkg)
		}
	}
}
