package engine

import (
	"testing"

	"github.com/softefa/softefa/internal/mem/memtest"
)

// TestMain lets the test binary serve as the child process whose memory the process tests reach.
func TestMain(m *testing.M) { memtest.Main(m) }
