"""slurm: job templates for train / eval / serve, rendered from configs and submitted with sbatch."""
