// TensorBoard's attnviz dashboard (attnviz.monitoring.plugin): choose a run and a step, see the offline HTML
// report's head view of the capture file that recording was made from.
export async function render() {
  const base = new URL('./', import.meta.url);
  const runs = await (await fetch(new URL('runs', base))).json();
  document.body.style.margin = '0';
  document.body.style.fontFamily = 'Roboto, sans-serif';
  const bar = document.createElement('div');
  bar.style.padding = '8px 12px';
  const runChoice = document.createElement('select');
  const stepChoice = document.createElement('select');
  runChoice.id = 'attnviz-run';
  stepChoice.id = 'attnviz-step';
  const frame = document.createElement('iframe');
  frame.id = 'attnviz-report';
  frame.style.cssText = 'width: 100%; height: calc(100vh - 48px); border: 0';
  const names = Object.keys(runs).sort();
  if (!names.length) {
    bar.textContent = 'No attnviz recording names a capture file yet: give AttentionMonitor keep=FOLDER, or run ' +
        'attnviz inspect CAPTURE --tensorboard DIR.';
    document.body.appendChild(bar);
    return;
  }
  for (const name of names) runChoice.add(new Option(name, name));
  const show = () => {
    const url = new URL('report', base);
    url.searchParams.set('run', runChoice.value);
    url.searchParams.set('step', stepChoice.value);
    frame.src = url.href;
  };
  const steps = () => {
    stepChoice.innerHTML = '';
    for (const step of runs[runChoice.value]) stepChoice.add(new Option(`step ${step}`, String(step)));
    stepChoice.selectedIndex = stepChoice.options.length - 1;  // the latest recording
    show();
  };
  runChoice.addEventListener('change', steps);
  stepChoice.addEventListener('change', show);
  bar.append('run ', runChoice, '  ', stepChoice);
  document.body.append(bar, frame);
  steps();
}
