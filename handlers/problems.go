package handlers

import (
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/valruns/valruns/problem"
)

// problemIndex godoc
//
//	@Summary		Problem codes
//	@ID			listProblems
//	@Description	The list of every problem code the API answers, each linked to its page. HTML, or Markdown with `Accept: text/markdown`. No authentication.
//	@Tags			meta
//	@Produce		html
//	@Produce		text/markdown
//	@Success		200	{string}	string	"The list of codes."
//	@Router			/problems/ [get]
func problemIndex(c *gin.Context) {
	servePage(c, "Problem codes", problem.Index())
}

// problemPage godoc
//
//	@Summary		A problem code's page
//	@ID			getProblem
//	@Description	What a problem code means and what to do about it: the page a problem document's `type` (`/problems/{code}`) names. HTML, or Markdown with `Accept: text/markdown`. No authentication.
//	@Tags			meta
//	@Produce		html
//	@Produce		text/markdown
//	@Produce		application/problem+json
//	@Param			code	path		string	true	"The problem's code, such as idempotency_key_reused."
//	@Success		200		{string}	string	"The code's page."
//	@Failure		404		{object}	problem.Details	"`not_found`: no problem has this code."
//	@Router			/problems/{code} [get]
func problemPage(c *gin.Context) {
	p, ok := problem.Lookup(c.Param("code"))
	if !ok {
		problem.Abort(c, http.StatusNotFound, problem.NotFound, "No problem has the code "+c.Param("code")+"; /problems/ lists them.")
		return
	}
	servePage(c, p.Code.String()+": "+p.Title, p.Document())
}

// servePage answers a page as Markdown to a client that asks for it
// (Accept: text/markdown), and as HTML rendered from it otherwise.
func servePage(c *gin.Context, title, markdown string) {
	c.Header("Vary", "Accept")
	if strings.Contains(c.GetHeader("Accept"), "text/markdown") {
		c.Header("Content-Type", "text/markdown; charset=utf-8")
		c.String(http.StatusOK, "%s", markdown)
		return
	}
	c.Header("Content-Type", "text/html; charset=utf-8")
	c.String(http.StatusOK, "%s", problem.RenderHTML(title, markdown))
}
