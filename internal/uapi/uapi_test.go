package uapi

import "testing"

// TestDerivedMasks checks the masks built from other values against the numbers in the kernel's
// headers (IB_ACCESS_SUPPORTED, IB_USER_LEGACY_LAST_QP_ATTR_MASK).
func TestDerivedMasks(t *testing.T) {
	if AccessSupported != 0x3ff000ff {
		t.Errorf("AccessSupported = %#x, want 0x3ff000ff", AccessSupported)
	}
	if QPAttrLegacyMask != 1<<21-1 {
		t.Errorf("QPAttrLegacyMask = %#x, want %#x", QPAttrLegacyMask, 1<<21-1)
	}
}
