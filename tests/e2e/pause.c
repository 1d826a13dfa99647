/*
 * The pod sandbox's only process in the CRI tests (tests/e2e/cri_harness.py builds it into
 * the pause image at test time): it holds the pod's namespaces open, reaps children that
 * get re-parented to it and exits cleanly on SIGINT or SIGTERM. Written for this project.
 */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig)
{
	(void)sig;
	_exit(0);
}

static void on_child(int sig)
{
	(void)sig;
	while (waitpid(-1, 0, WNOHANG) > 0)
		;
}

int main(void)
{
	struct sigaction stop = { .sa_handler = on_stop };
	struct sigaction child = { .sa_handler = on_child, .sa_flags = SA_NOCLDSTOP | SA_RESTART };

	sigemptyset(&stop.sa_mask);
	sigemptyset(&child.sa_mask);
	if (sigaction(SIGINT, &stop, 0) || sigaction(SIGTERM, &stop, 0) || sigaction(SIGCHLD, &child, 0))
		return 1;
	for (;;)
		pause();
}
