package efadv

import (
	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/provider"
	"github.com/softefa/softefa/verbs"
)

// The provider's hooks at their types (see internal/provider). Package verbs set them in its
// init, which has run by the time this package initialises.
var (
	contextConfig = provider.ContextConfig.(func(*verbs.Context) *config.Device)
	createCQ      = provider.CreateCQ.(func(*verbs.Context, *verbs.CQInitAttrEx, bool, bool) (*verbs.CQ, error))
	readSGID      = provider.ReadSGID.(func(*verbs.CQ) (verbs.GID, error))
	isUnsolicited = provider.IsUnsolicited.(func(*verbs.CQ) bool)
	cqRing        = provider.CQRing.(func(*verbs.CQ) ([]byte, int, int, *uint32))
	createQPEx    = provider.CreateQPEx.(func(*verbs.Context, *verbs.QPInitAttrEx, *provider.QPAttr) (*verbs.QP, error))
	createQP      = provider.CreateQP.(func(*verbs.PD, *verbs.QPInitAttr, *provider.QPAttr) (*verbs.QP, error))
	qpWQs         = provider.QPWQs.(func(*verbs.QP) (provider.WQ, provider.WQ))
	ringDoorbell  = provider.RingDoorbell.(func(*verbs.QP, *uint32, uint32) error)
	setHints      = provider.SetProcessingHints.(func(*verbs.QPEx, uint32))
	ahn           = provider.AHN.(func(*verbs.AH) uint16)
)

// deviceCaps returns the caps of ctx's device (config.CapsNone is none).
func deviceCaps(ctx *verbs.Context) DeviceCaps {
	return DeviceCaps(contextConfig(ctx).Caps &^ config.CapsNone)
}
