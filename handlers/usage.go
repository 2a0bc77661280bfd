package handlers

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/valruns/valruns/models"
)

type usageHandlers struct {
	usage        *models.UsageStore
	defaultQuota int64
}

// Usage is what the organisation is billed for this month.
type Usage struct {
	// Period is the calendar month (UTC) counted, as YYYY-MM.
	Period string `json:"period" validate:"required" example:"2026-11"`
	// PeriodStart and PeriodEnd bound the period: [start, end).
	PeriodStart time.Time `json:"period_start" validate:"required" format:"date-time" example:"2026-11-01T00:00:00Z"`
	PeriodEnd   time.Time `json:"period_end" validate:"required" format:"date-time" example:"2026-12-01T00:00:00Z"`
	// Runs started this period: each counted once, however often its start was retried.
	Runs int64 `json:"runs" validate:"required" minimum:"0" example:"42"`
	// Quota is the monthly run quota; 0 means unlimited.
	Quota int64 `json:"quota" validate:"required" minimum:"0" example:"1000"`
	// Unlimited is true when the organisation has no quota.
	Unlimited bool `json:"unlimited" validate:"required" example:"false"`
	// Remaining is how many runs can still start this period; absent when unlimited.
	Remaining *int64 `json:"remaining,omitempty" minimum:"0" example:"958"`
}

// get godoc
//
//	@Summary		Usage this month
//	@ID			getUsage
//	@Description	The organisation's runs this calendar month (UTC) and its monthly quota: what it is billed. Every run counts once, however often its start was retried; a start past the quota is answered 429 `quota_exceeded` and counts nothing. A quota just changed by an operator applies to starts within `AUTH_CACHE_TTL`.
//	@Tags			usage
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Success		200	{object}	Usage				"This month's usage."
//	@Failure		401	{object}	ProblemUnauthorized	"common:unauthorized"
//	@Failure		500	{object}	ProblemInternal		"common:internal"
//	@Failure		503	{object}	ProblemUnavailable	"common:unavailable"
//	@Router			/api/usage [get]
func (h *usageHandlers) get(c *gin.Context) {
	u, err := h.usage.Get(c.Request.Context(), principalOf(c).OrgID, h.defaultQuota, time.Now())
	if err != nil {
		internalError(c, err)
		return
	}
	out := Usage{
		Period: u.Period.Format("2006-01"), PeriodStart: u.Period, PeriodEnd: u.Period.AddDate(0, 1, 0),
		Runs: u.Runs, Quota: u.Quota, Unlimited: u.Quota == 0,
	}
	if u.Quota > 0 {
		left := max(u.Quota-u.Runs, 0)
		out.Remaining = &left
	}
	c.PureJSON(http.StatusOK, out)
}
