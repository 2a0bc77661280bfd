package handlers

import (
	"context"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

type healthHandlers struct {
	db    *gorm.DB
	ready func(context.Context) error
}

// Status is the body of /healthz and /readyz.
type Status struct {
	Status string `json:"status" validate:"required" example:"ok"`
}

// live godoc
//
//	@Summary		Liveness
//	@ID			liveness
//	@Description	Answers 200 while the process serves HTTP. It checks nothing else (see /readyz). No authentication.
//	@Tags			health
//	@Produce		json
//	@Success		200	{object}	Status	"Alive."
//	@Router			/healthz [get]
func (h *healthHandlers) live(c *gin.Context) { c.PureJSON(http.StatusOK, Status{Status: "ok"}) }

// readyz godoc
//
//	@Summary		Readiness
//	@ID			readiness
//	@Description	Answers 200 when the database answers a ping within 2 s and the process is ready, 503 otherwise: `service_unavailable` when the database does not answer; `not_ready` while the process drains at shutdown (SIGTERM, for `SHUTDOWN_DRAIN`: requests are still served, so that a load balancer sees it leave first) and, with `serve --worker`, while its worker is not (its task server stopped, or Redis unreachable). No authentication.
//	@Tags			health
//	@Produce		json
//	@Produce		application/problem+json
//	@Success		200	{object}	Status			"Ready."
//	@Failure		503	{object}	ProblemUnavailable	"`service_unavailable`: the database does not answer a ping within 2 s; `not_ready`: the process drains at shutdown, or its worker is not ready."
//	@Header			503	{integer}	Retry-After		"Seconds to wait before asking again."
//	@Router			/readyz [get]
func (h *healthHandlers) readyz(c *gin.Context) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), 2*time.Second)
	defer cancel()
	if err := models.SQLDB(h.db).PingContext(ctx); err != nil {
		c.Header("Retry-After", "1")
		problem.Abort(c, http.StatusServiceUnavailable, problem.ServiceUnavailable, "The database does not answer.")
		return
	}
	if h.ready != nil {
		if err := h.ready(ctx); err != nil {
			c.Header("Retry-After", "1")
			problem.Abort(c, http.StatusServiceUnavailable, problem.NotReady, err.Error())
			return
		}
	}
	c.PureJSON(http.StatusOK, Status{Status: "ok"})
}
